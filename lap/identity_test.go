package lap

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestCookieIdentity(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("s", 32)
	if _, err := NewCookieIdentity("sid", "short"); err == nil {
		t.Error("short key accepted")
	}
	ci, err := NewCookieIdentity("sid", key)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, cookie, want string
		wantErr            bool
	}{
		{"none", "", "", false},
		{"valid", SignCookieValue("alice", key), "alice", false},
		{"dotted uid", SignCookieValue("a.b", key), "", true}, // split at the first dot, like the reference
		{"forged", "alice." + strings.Repeat("A", 43), "", true},
		{"other key", SignCookieValue("alice", strings.Repeat("x", 32)), "", true},
		{"no sig", "alice", "", true},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		if tc.cookie != "" {
			r.AddCookie(&http.Cookie{Name: "sid", Value: tc.cookie})
		}
		uid, err := ci.Resolve(r)
		if uid != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s: %q %v", tc.name, uid, err)
		}
	}
}

func TestJWTIdentity(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("j", 32)
	ji, err := NewJWTIdentity(JWTConfig{Header: "Authorization", HS256: secret, Issuer: "app", Claim: "uid"})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(m jwt.SigningMethod, claims jwt.MapClaims, key any) string {
		s, err := jwt.NewWithClaims(m, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := time.Now().Add(time.Hour).Unix()
	tests := []struct {
		name, tok, want string
		wantErr         bool
	}{
		{"valid", sign(jwt.SigningMethodHS256, jwt.MapClaims{"uid": "alice", "iss": "app", "exp": exp}, []byte(secret)), "alice", false},
		{"no exp", sign(jwt.SigningMethodHS256, jwt.MapClaims{"uid": "alice", "iss": "app"}, []byte(secret)), "", true},
		{"expired", sign(jwt.SigningMethodHS256, jwt.MapClaims{"uid": "alice", "iss": "app", "exp": time.Now().Add(-time.Hour).Unix()}, []byte(secret)), "", true},
		{"wrong iss", sign(jwt.SigningMethodHS256, jwt.MapClaims{"uid": "alice", "iss": "evil", "exp": exp}, []byte(secret)), "", true},
		{"wrong alg", sign(jwt.SigningMethodHS384, jwt.MapClaims{"uid": "alice", "iss": "app", "exp": exp}, []byte(secret)), "", true},
		{"none alg", sign(jwt.SigningMethodNone, jwt.MapClaims{"uid": "alice", "iss": "app", "exp": exp}, jwt.UnsafeAllowNoneSignatureType), "", true},
		{"no claim", sign(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "iss": "app", "exp": exp}, []byte(secret)), "", true},
		{"absent", "", "", false},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		if tc.tok != "" {
			r.Header.Set("Authorization", "Bearer "+tc.tok)
		}
		uid, err := ji.Resolve(r)
		if uid != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s: %q %v", tc.name, uid, err)
		}
	}
	if _, err := NewJWTIdentity(JWTConfig{Header: "X", HS256: "short"}); err == nil {
		t.Error("short secret accepted")
	}
	if _, err := NewJWTIdentity(JWTConfig{HS256: secret}); err == nil {
		t.Error("no source accepted")
	}
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	l := newLimiter(0.5, 2, 3, clock)
	for i, want := range []bool{true, true, false} {
		if ok, _ := l.allow("a"); ok != want {
			t.Fatalf("call %d: %v", i, ok)
		}
	}
	if ok, ms := l.allow("a"); ok || ms != 2000 {
		t.Errorf("retryAfterMs = %d, want 2000", ms)
	}
	now = now.Add(2 * time.Second)
	if ok, _ := l.allow("a"); !ok {
		t.Error("not refilled")
	}
	l.allow("a") // a: empty bucket, most recently used
	l.allow("b")
	l.allow("c")
	if ok, _ := l.allow("d"); !ok { // table full: the LRU ("a") makes room
		t.Error("a new key was refused on a full table")
	}
	if len(l.m) != 3 || l.m["a"] != nil || l.evicted.Load() != 1 {
		t.Errorf("keys %d, a kept %v, evicted %d", len(l.m), l.m["a"] != nil, l.evicted.Load())
	}
	now = now.Add(time.Minute) // everything idle: swept
	l.allow("e")
	if len(l.m) != 1 {
		t.Errorf("idle keys not swept: %d left", len(l.m))
	}
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		xff   string
		trust int
		want  string
	}{
		{"1.1.1.1, 2.2.2.2", 0, "192.0.2.1"},
		{"1.1.1.1, 2.2.2.2", 1, "2.2.2.2"},
		{"1.1.1.1, 2.2.2.2", 2, "1.1.1.1"},
		{"1.1.1.1", 2, "192.0.2.1"},
	}
	for _, tc := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Forwarded-For", tc.xff)
		if got := clientIP(r, tc.trust); got != tc.want {
			t.Errorf("%q trust %d: %s", tc.xff, tc.trust, got)
		}
	}
}
