package e2e

import (
	"fmt"
	"testing"
	"time"
)

// restrictedContainer is what Pod Security "restricted" asks of an application container.
const restrictedContainer = `
        securityContext:
          runAsNonRoot: true
          allowPrivilegeEscalation: false
          seccompProfile: {type: RuntimeDefault}
          capabilities: {drop: [ALL]}`

// TestPodSecurityRestricted: in a namespace enforcing Pod Security "restricted", Deployments
// whose own container complies are admitted once injected - the agent's environment, or the
// sidecar container the webhook adds - and run, and their flow pauses and resumes them.
func TestPodSecurityRestricted(t *testing.T) {
	kinds(t, everyConsumer, func(t *testing.T, k consumerKind) {
		const app, sub = "orders-worker", "orders-ingest"
		ns := namespaceFor("shop-restricted", k)
		topic := "persistent://public/default/" + ns
		namespace(t, ns, "pod-security.kubernetes.io/enforce=restricted")
		k.deploy(t, ns, app, 2, topic, sub, restrictedContainer)
		apply(t, flow(ns, sub, app, topic, sub, "Paused"))
		kubectl(t, "rollout", "status", "deployment/"+app, "-n", ns, "--timeout=180s")
		kubectl(t, "wait", "sf/"+sub, "-n", ns, "--for=condition=Paused", "--timeout=60s")
		eventually(t, 30*time.Second, "both pods reported paused", func() error { return pausedColumnIs(t, ns, sub, "2/2") })
		during := produce(t, topic, "during", 10)
		assertNothingProcessed(t, ns, "app="+app, during, 3*time.Second)
		kubectl(t, "patch", "sf", sub, "-n", ns, "--type", "merge", "-p", `{"spec":{"state":"Running"}}`)
		eventually(t, 60*time.Second, "the messages are processed after the resume", func() error {
			if m := missing(during, printed(t, ns, "app="+app, "app")); len(m) > 0 {
				return fmt.Errorf("%d not processed", len(m))
			}
			return nil
		})
	})
}
