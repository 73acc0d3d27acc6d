package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// DefaultTokenSecret is the Secret holding the agents' bearer token when a flow names none.
const (
	DefaultTokenSecret = "subflow-agent-token"
	DefaultTokenKey    = "token"
)

func tokenRef(flow *subflowv1.SubscriptionFlow) (name, key string) {
	name, key = DefaultTokenSecret, DefaultTokenKey
	if ref := flow.Spec.Agent.TokenSecretRef; ref != nil {
		name = ref.Name
		if ref.Key != "" {
			key = ref.Key
		}
	}
	return name, key
}

// agentToken reads the flow's token Secret (uncached: the manager's client reads Secrets
// directly) and creates it with a random token when missing.
func (r *SubscriptionFlowReconciler) agentToken(ctx context.Context, flow *subflowv1.SubscriptionFlow) (string, error) {
	name, key := tokenRef(flow)
	var secret corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: flow.Namespace, Name: name}, &secret)
	if apierrors.IsNotFound(err) {
		return r.createToken(ctx, flow.Namespace, name, key)
	}
	if err != nil {
		return "", err
	}
	token, ok := secret.Data[key]
	if !ok || len(token) == 0 {
		return "", fmt.Errorf("secret %s/%s has no key %q", flow.Namespace, name, key)
	}
	return string(token), nil
}

func (r *SubscriptionFlowReconciler) createToken(ctx context.Context, namespace, name, key string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "subflow"}},
		Data: map[string][]byte{key: []byte(token)},
	}
	if err := r.Create(ctx, secret); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Another reconcile created it first: use theirs.
			return "", fmt.Errorf("token secret %s/%s appeared concurrently, retrying: %w", namespace, name, err)
		}
		return "", err
	}
	return token, nil
}
