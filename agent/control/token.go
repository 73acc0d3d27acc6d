package control

import (
	"crypto/subtle"
	"errors"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenSource yields the bearer token. The file is read at every check: the kubelet rewrites
// a mounted Secret in place, and a rotation must take effect even when size and modification
// time stay the same. The file is a few bytes, and a request without any token reads nothing.
//
// When the file's token changes, the one before it is still accepted for grace, so that pushes
// the controller sent before it saw the rotation are not refused on their way.
type tokenSource struct {
	file  string
	fixed string
	grace time.Duration
	now   func() time.Time

	mu        sync.Mutex
	last      string // the file's token at the previous read
	previous  string // the token before last, accepted until changedAt+grace
	changedAt time.Time
}

// accepts reports whether got is the current token or, within the grace, the previous one.
func (t *tokenSource) accepts(got string) (bool, error) {
	current, err := t.current()
	if err != nil {
		return false, err
	}
	previous := t.remember(current)
	return sameToken(got, current) || (previous != "" && sameToken(got, previous)), nil
}

// remember notes current as the file's token and returns the previous one while its grace lasts.
func (t *tokenSource) remember(current string) string {
	if t.file == "" || t.grace <= 0 {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.last != "" && t.last != current {
		t.previous, t.changedAt = t.last, now
	}
	t.last = current
	if t.previous == "" || !now.Before(t.changedAt.Add(t.grace)) || t.previous == current {
		t.previous = ""
	}
	return t.previous
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
