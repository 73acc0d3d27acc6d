package control

import (
	"errors"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenSource yields the bearer token, re-reading the file when it changes (a rotated Secret is
// updated in place by the kubelet).
type tokenSource struct {
	file  string
	fixed string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	token   string
}

func (t *tokenSource) current() (string, error) {
	if t.file == "" {
		return t.fixed, nil
	}
	info, err := os.Stat(t.file)
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && info.ModTime().Equal(t.modTime) && info.Size() == t.size {
		return t.token, nil
	}
	data, err := os.ReadFile(t.file)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", errors.New("token file " + t.file + " is empty")
	}
	t.token, t.modTime, t.size = token, info.ModTime(), info.Size()
	return token, nil
}
