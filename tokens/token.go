package tokens

import (
	"crypto/rand"
	"crypto/sha256"
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
	if len(token) != tokenLen || token[:len(Prefix)] != Prefix {
		return "", ErrMalformed
	}
	for i := len(Prefix); i < len(token); i++ {
		c := token[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", ErrMalformed
		}
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:]), nil
}

// newTID returns a random (version 4) UUID in its canonical text form.
func newTID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
