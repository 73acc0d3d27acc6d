package pulsartest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/subflow-dev/subflow/internal/testing/testkit"
)

func doAs(t *testing.T, token, method, url, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// With AdminToken the admin API answers 401 without a known token, lets the
// application's role read stats and reset cursors, and keeps policies and
// partition changes for the superuser (403 to the application).
func TestAdminTokenAuthenticatesAndAuthorizes(t *testing.T) {
	b := Start(t, Options{AdminToken: "app", AdminSuperToken: "root"})
	parkSubscription(t, newClient(t, b), "secured")
	base := b.AdminURL() + topicPath("secured")
	cases := []struct {
		token, method, path, body string
		want                      int
	}{
		{"", http.MethodGet, "/stats", "", http.StatusUnauthorized},
		{"wrong", http.MethodGet, "/stats", "", http.StatusUnauthorized},
		{"app", http.MethodGet, "/stats", "", http.StatusOK},
		{"app", http.MethodGet, "/internalStats", "", http.StatusOK},
		{"app", http.MethodGet, "/partitions", "", http.StatusOK},
		{"app", http.MethodGet, "/messageTTL?applied=true", "", http.StatusForbidden},
		{"app", http.MethodGet, "/backlogQuotaMap?applied=true", "", http.StatusForbidden},
		{"app", http.MethodPost, "/messageTTL?messageTTL=5", "", http.StatusForbidden},
		{"root", http.MethodGet, "/messageTTL?applied=true", "", http.StatusOK},
		{"root", http.MethodPost, "/messageTTL?messageTTL=5", "", http.StatusNoContent},
	}
	for _, c := range cases {
		if got := doAs(t, c.token, c.method, base+c.path, c.body); got != c.want {
			t.Errorf("%s %s with token %q: %d, want %d", c.method, c.path, c.token, got, c.want)
		}
	}
	if got := doAs(t, "app", http.MethodGet, b.AdminURL()+nsPath+"/messageTTL", ""); got != http.StatusForbidden {
		t.Errorf("namespace policy read by the application: %d, want 403", got)
	}
	if got := doAs(t, "app", http.MethodPut, b.AdminURL()+topicPath("secured-p")+"/partitions", "2"); got != http.StatusForbidden {
		t.Errorf("partitioned topic created by the application: %d, want 403", got)
	}
}

// Authentication comes before the ownership check: a non-owner answers 401
// to a call without credentials rather than redirecting it, and the owner
// checks the credentials of the redirected call again.
func TestAdminTokenCheckedBeforeAndAfterARedirect(t *testing.T) {
	cl := StartCluster(t, 2, Options{AdminToken: "app"})
	if err := cl.MoveTopic("sec", 1); err != nil {
		t.Fatal(err)
	}
	parkSubscription(t, testkit.NewClient(t, cl.Broker(0).ServiceURL()), "sec")
	url := cl.Broker(0).AdminURL() + topicPath("sec") + "/stats"
	if got := doAs(t, "", http.MethodGet, url, ""); got != http.StatusUnauthorized {
		t.Fatalf("non-owner without credentials: %d, want 401", got)
	}
	// net/http keeps Authorization on a redirect to the same host name (the
	// port differs), so the owner sees the token.
	if got := doAs(t, "app", http.MethodGet, url, ""); got != http.StatusOK {
		t.Fatalf("through the redirect with credentials: %d, want 200", got)
	}
	noAuthOnRedirect := &http.Client{CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		req.Header.Del("Authorization")
		return nil
	}}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer app")
	resp, err := noAuthOnRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("owner reached without credentials: %d, want 401", resp.StatusCode)
	}
}
