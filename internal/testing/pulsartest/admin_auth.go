package pulsartest

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// authenticated is the broker's AuthenticationFilter and the authorization
// of PulsarAuthorizationProvider, reduced to two roles, when
// Options.AdminToken is set: every admin call needs a bearer token (401
// without a known one, before any redirect to the topic's owner); a
// superuser (AdminSuperToken) may do anything; the application's role
// (AdminToken) has topic operations (stats, internal stats, reading entries,
// reset cursor, partition metadata: canLookup/canConsume) but no tenant
// admin rights, so policies and partition changes answer 403
// (allowTopicPolicyOperationAsync, allowNamespacePolicyOperationAsync and
// allowNamespaceOperationAsync -> validateTenantAdminAccess).
func (b *Broker) authenticated(next http.Handler) http.Handler {
	if b.opts.AdminToken == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch {
		case b.opts.AdminSuperToken != "" && same(token, b.opts.AdminSuperToken):
		case !same(token, b.opts.AdminToken):
			writeReason(w, http.StatusUnauthorized, "Authentication required")
			return
		case needsTenantAdmin(r):
			writeReason(w, http.StatusForbidden, "Unauthorized to validateTopicPolicyOperation for operation on "+r.URL.Path)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func same(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// needsTenantAdmin tells the calls that need tenant admin rights: namespace
// and topic policies (even reads) and creating or growing partitions.
func needsTenantAdmin(r *http.Request) bool {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/admin/v2/namespaces/"):
		return true
	case strings.HasSuffix(p, "/messageTTL"), strings.HasSuffix(p, "/backlogQuota"), strings.HasSuffix(p, "/backlogQuotaMap"):
		return true
	case strings.HasSuffix(p, "/partitions"):
		return r.Method != http.MethodGet
	}
	return false
}
