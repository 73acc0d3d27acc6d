package control

import (
	"crypto/subtle"
	"errors"
	"os"
	"strings"
)

// tokenSource yields the bearer token. The file is read at every check: the kubelet rewrites
// a mounted Secret in place, and a rotation must take effect even when size and modification
// time stay the same. The file is a few bytes, and a request without any token reads nothing.
type tokenSource struct {
	file  string
	fixed string
}

func (t *tokenSource) current() (string, error) {
	if t.file == "" {
		return t.fixed, nil
	}
	data, err := os.ReadFile(t.file)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", errors.New("token file " + t.file + " is empty")
	}
	return token, nil
}

// bearerToken returns the credentials of an Authorization header of the Bearer scheme; the
// scheme name is case-insensitive (RFC 9110, section 11.1).
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}

// sameToken compares in constant time, so that timing tells nothing about the token.
func sameToken(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
