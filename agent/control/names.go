package control

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/subflow-dev/subflow/agent/protocol"
)

// flowsPrefix is the escaped path prefix of the flow endpoints.
const flowsPrefix = protocol.PathPrefix + "/flows/"

// flowKey parses the namespace and name of a flow endpoint from the path as sent. Kubernetes
// names never need escaping, so any escape ("%2F", "%00", "%2E") is refused: two spellings
// can never name one rule, and a decoded "/" can never split or join segments.
func flowKey(u *url.URL) (namespace, name string, err error) {
	rest, ok := strings.CutPrefix(u.EscapedPath(), flowsPrefix)
	if !ok {
		return "", "", fmt.Errorf("path must be %s{namespace}/{name}", flowsPrefix)
	}
	namespace, name, ok = strings.Cut(rest, "/")
	if !ok || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("path must be %s{namespace}/{name}", flowsPrefix)
	}
	if strings.Contains(rest, "%") {
		return "", "", fmt.Errorf("path %q: namespace and name must not be percent-encoded", u.EscapedPath())
	}
	if err := validNamespace(namespace); err != nil {
		return "", "", err
	}
	if err := validName(name); err != nil {
		return "", "", err
	}
	return namespace, name, nil
}

// validNamespace accepts a Kubernetes namespace: an RFC 1123 label.
func validNamespace(s string) error {
	if !isDNSLabel(s) {
		return fmt.Errorf("namespace %s: want a lowercase RFC 1123 label (a-z, 0-9, '-', at most 63 characters)", quoteShort(s))
	}
	return nil
}

// validName accepts a Kubernetes object name: an RFC 1123 subdomain.
func validName(s string) error {
	if len(s) > 253 {
		return fmt.Errorf("name %s: longer than 253 characters", quoteShort(s))
	}
	for _, label := range strings.Split(s, ".") {
		if !isLabelChars(label) {
			return fmt.Errorf("name %s: want a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.', at most 253 characters)", quoteShort(s))
		}
	}
	return nil
}

func isDNSLabel(s string) bool { return len(s) <= 63 && isLabelChars(s) }

// isLabelChars: non-empty, [a-z0-9-], starting and ending alphanumeric.
func isLabelChars(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// quoteShort quotes s for an error message, cut so that a huge name gives a short answer.
func quoteShort(s string) string {
	if len(s) > 80 {
		return fmt.Sprintf("%q... (%d bytes)", s[:80], len(s))
	}
	return fmt.Sprintf("%q", s)
}
