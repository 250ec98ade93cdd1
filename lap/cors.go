package lap

import (
	"net/http"
	"strings"
)

// corsHeaders handles the Origin of a meta request: same-origin or no Origin
// passes untouched; an allowlisted origin gets Access-Control-* headers (with
// credentials); any other origin is refused (false), which also stops
// cross-site form posts from minting or revoking with the user's cookies.
func (s *Server) corsHeaders(w http.ResponseWriter, r *http.Request, method string) bool {
	origin := r.Header.Get("Origin")
	h := w.Header()
	h.Add("Vary", "Origin")
	if origin == "" || origin == s.requestOrigin(r) {
		return true
	}
	if !s.cors[strings.TrimRight(origin, "/")] {
		return false
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Allow-Credentials", "true")
	if r.Method == http.MethodOptions {
		h.Set("Access-Control-Allow-Methods", method+", OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Content-Type, Authorization")
		h.Set("Access-Control-Max-Age", "600")
	}
	return true
}
