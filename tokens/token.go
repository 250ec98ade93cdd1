package tokens

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// tokenLen is the length of a token: the prefix plus base64url (no padding)
// of 32 bytes, 43 characters.
const tokenLen = len(Prefix) + 43

// Generate returns a fresh token and its hash.
func Generate() (token, hash string) {
	var b [32]byte
	rand.Read(b[:]) // never returns an error; it crashes the program if the OS has no randomness
	token = Prefix + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(sum[:])
}

// Hash returns hex(SHA-256(token)) or ErrMalformed when the prefix is missing,
// or the token is not 47 characters of base64url after it. The check is
// cheap and runs before any store lookup.
func Hash(token string) (string, error) {
	if len(token) != tokenLen || token[:len(Prefix)] != Prefix || !base64url(token[len(Prefix):]) {
		return "", ErrMalformed
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:]), nil
}

// TabPrefix starts every tab secret.
const TabPrefix = "tab_"

// GenerateTabSecret returns a fresh tab secret ("tab_" + base64url of 32
// CSPRNG bytes) and its hash. A tab secret is the tab's own credential: it
// opens the tab's WebSocket and proves an anonymous session's ownership, and
// is never shown to the LLM side.
func GenerateTabSecret() (secret, hash string) {
	var b [32]byte
	rand.Read(b[:])
	secret = TabPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(secret))
	return secret, hex.EncodeToString(sum[:])
}

// HashTabSecret returns hex(SHA-256(secret)), or ErrMalformed when secret is
// not "tab_" + 43 base64url characters.
func HashTabSecret(secret string) (string, error) {
	if len(secret) != tokenLen || secret[:len(TabPrefix)] != TabPrefix || !base64url(secret[len(TabPrefix):]) {
		return "", ErrMalformed
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:]), nil
}

func base64url(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// matchHash reports, in constant time, whether secret hashes (with hashFn)
// to want; an empty want or secret never matches.
func matchHash(secret, want string, hashFn func(string) (string, error)) bool {
	if secret == "" || want == "" {
		return false
	}
	h, err := hashFn(secret)
	return err == nil && subtle.ConstantTimeCompare([]byte(h), []byte(want)) == 1
}

// newTID returns a random (version 4) UUID in its canonical text form.
func newTID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
