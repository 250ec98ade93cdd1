package lap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// IdentityResolver tells who the human behind a meta request (mint, resume,
// revoke, sessions) is, from the host app's own auth (usually a cookie).
// uid "" means anonymous; an error is treated as anonymous too (and logged).
type IdentityResolver interface {
	Resolve(r *http.Request) (uid string, err error)
}

// IdentityFunc adapts a function to IdentityResolver.
type IdentityFunc func(r *http.Request) (string, error)

// Resolve calls f.
func (f IdentityFunc) Resolve(r *http.Request) (string, error) { return f(r) }

// CookieIdentity reads a signed cookie in the reference format
// "<uid>.<base64url(HMAC-SHA256(key, uid))>". Build it with NewCookieIdentity.
type CookieIdentity struct {
	Name string
	Key  []byte
}

// MinCookieKey is the shortest accepted signing key.
const MinCookieKey = 32

// NewCookieIdentity returns a CookieIdentity; the key must have at least 32 characters.
func NewCookieIdentity(name, key string) (*CookieIdentity, error) {
	if name == "" {
		return nil, errors.New("lap: cookie identity needs a cookie name")
	}
	if len(key) < MinCookieKey {
		return nil, fmt.Errorf("lap: cookie signing key must be at least %d characters (got %d)", MinCookieKey, len(key))
	}
	return &CookieIdentity{Name: name, Key: []byte(key)}, nil
}

// SignCookieValue returns the cookie value for uid signed with key.
func SignCookieValue(uid, key string) string {
	return uid + "." + cookieMAC(uid, []byte(key))
}

func cookieMAC(uid string, key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(uid))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Resolve returns the uid of a validly signed cookie, or "" when there is none.
func (c *CookieIdentity) Resolve(r *http.Request) (string, error) {
	ck, err := r.Cookie(c.Name)
	if err != nil {
		return "", nil
	}
	uid, sig, ok := strings.Cut(ck.Value, ".")
	if !ok || uid == "" {
		return "", errors.New("lap: malformed identity cookie")
	}
	if !hmac.Equal([]byte(sig), []byte(cookieMAC(uid, c.Key))) {
		return "", errors.New("lap: identity cookie signature mismatch")
	}
	return uid, nil
}

// JWTConfig configures a JWTIdentity.
type JWTConfig struct {
	Cookie   string // read the JWT from this cookie, or
	Header   string // from this header (a "Bearer " prefix is stripped)
	HS256    string // shared secret (≥ 32 chars) for HS256
	RS256PEM string // PEM public key for RS256
	ES256PEM string // PEM public key for ES256
	// PublicKeyPEM is a PEM public key whose type picks the algorithm (RSA →
	// RS256, EC P-256 → ES256); handy for a --jwt-public-key file.
	PublicKeyPEM string
	Issuer       string // required iss when set
	Audience     string // required aud when set
	Claim        string // the uid claim; default "sub"
}

// JWTIdentity verifies a JWT issued by the host app's own auth and returns one
// of its claims as the uid. Only the configured algorithms are accepted and
// exp is required.
type JWTIdentity struct {
	cfg     JWTConfig
	methods []string
	keys    map[string]any
}

// NewJWTIdentity checks cfg and parses its keys.
func NewJWTIdentity(cfg JWTConfig) (*JWTIdentity, error) {
	if (cfg.Cookie == "") == (cfg.Header == "") {
		return nil, errors.New("lap: JWT identity needs exactly one of Cookie or Header")
	}
	if cfg.Claim == "" {
		cfg.Claim = "sub"
	}
	j := &JWTIdentity{cfg: cfg, keys: map[string]any{}}
	if cfg.HS256 != "" {
		if len(cfg.HS256) < MinCookieKey {
			return nil, fmt.Errorf("lap: HS256 secret must be at least %d characters", MinCookieKey)
		}
		j.keys["HS256"] = []byte(cfg.HS256)
	}
	if cfg.RS256PEM != "" {
		k, err := jwt.ParseRSAPublicKeyFromPEM([]byte(cfg.RS256PEM))
		if err != nil {
			return nil, fmt.Errorf("lap: RS256 public key: %w", err)
		}
		j.keys["RS256"] = k
	}
	if cfg.ES256PEM != "" {
		k, err := jwt.ParseECPublicKeyFromPEM([]byte(cfg.ES256PEM))
		if err != nil {
			return nil, fmt.Errorf("lap: ES256 public key: %w", err)
		}
		j.keys["ES256"] = k
	}
	if cfg.PublicKeyPEM != "" {
		if k, err := jwt.ParseRSAPublicKeyFromPEM([]byte(cfg.PublicKeyPEM)); err == nil {
			j.keys["RS256"] = k
		} else if k, err2 := jwt.ParseECPublicKeyFromPEM([]byte(cfg.PublicKeyPEM)); err2 == nil {
			j.keys["ES256"] = k
		} else {
			return nil, fmt.Errorf("lap: public key is neither RSA (%v) nor EC (%v)", err, err2)
		}
	}
	if len(j.keys) == 0 {
		return nil, errors.New("lap: JWT identity needs a key (HS256, RS256PEM or ES256PEM)")
	}
	for m := range j.keys {
		j.methods = append(j.methods, m)
	}
	return j, nil
}

// Resolve returns the configured claim of a valid JWT, "" when none is presented.
func (j *JWTIdentity) Resolve(r *http.Request) (string, error) {
	var raw string
	if j.cfg.Cookie != "" {
		if ck, err := r.Cookie(j.cfg.Cookie); err == nil {
			raw = ck.Value
		}
	} else {
		raw = r.Header.Get(j.cfg.Header)
		if t, ok := BearerToken(raw); ok {
			raw = t
		}
	}
	if raw == "" {
		return "", nil
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(j.methods), jwt.WithExpirationRequired()}
	if j.cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.cfg.Issuer))
	}
	if j.cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(j.cfg.Audience))
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(t *jwt.Token) (any, error) {
		k, ok := j.keys[t.Method.Alg()]
		if !ok {
			return nil, fmt.Errorf("unexpected alg %s", t.Method.Alg())
		}
		return k, nil
	}, opts...)
	if err != nil {
		return "", fmt.Errorf("lap: identity JWT: %w", err)
	}
	uid, _ := claims[j.cfg.Claim].(string)
	if uid == "" {
		return "", fmt.Errorf("lap: identity JWT has no string %q claim", j.cfg.Claim)
	}
	return uid, nil
}
