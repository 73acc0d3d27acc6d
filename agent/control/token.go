package control

import (
	"crypto/subtle"
	"errors"
	"io"
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
// the controller sent before it saw the rotation are not refused on their way. The grace counts
// from the rotation, the new file's modification time, not from the first request after it:
// that request may come long after, and be from whoever the rotation meant to lock out.
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

// tokenFile is what the token file held at a check.
type tokenFile struct {
	token    string
	modified time.Time // zero for a fixed token
}

// accepts reports whether got is the current token or, within the grace, the previous one.
func (t *tokenSource) accepts(got string) (bool, error) {
	current, err := t.current()
	if err != nil {
		return false, err
	}
	previous := t.remember(current)
	return sameToken(got, current.token) || (previous != "" && sameToken(got, previous)), nil
}

// remember notes current as the file's token and returns the previous one while its grace
// lasts. A file rewritten with an older modification time than the rotation's ends the grace
// as early: the bound holds, at the price of refusing pushes that were on their way.
func (t *tokenSource) remember(current tokenFile) string {
	if t.file == "" || t.grace <= 0 {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.last != "" && t.last != current.token {
		t.previous, t.changedAt = t.last, current.modified
		if t.changedAt.After(now) {
			t.changedAt = now
		}
	}
	t.last = current.token
	if t.previous == "" || !now.Before(t.changedAt.Add(t.grace)) || t.previous == current.token {
		t.previous = ""
	}
	return t.previous
}

// current reads the token file, and its modification time from the same open file, so that
// both come from one version when the kubelet swaps in a new one.
func (t *tokenSource) current() (tokenFile, error) {
	if t.file == "" {
		return tokenFile{token: t.fixed}, nil
	}
	f, err := os.Open(t.file)
	if err != nil {
		return tokenFile{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return tokenFile{}, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return tokenFile{}, err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return tokenFile{}, errors.New("token file " + t.file + " is empty")
	}
	return tokenFile{token: token, modified: info.ModTime()}, nil
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
