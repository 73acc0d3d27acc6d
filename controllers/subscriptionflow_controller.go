// Package controllers holds the SubscriptionFlow reconciler: it computes the effective state of
// each flow, pushes it to the agents of the selected pods and writes what they report into status.
package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subflowv1 "github.com/subflow-dev/subflow/api/v1alpha1"
)

// Permissions, least privilege: Secrets are read one by one (get) and created when missing; the
// controller never lists or watches them.
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=subflow.dev,resources=subscriptionflows/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SubscriptionFlowReconciler reconciles SubscriptionFlow objects.
type SubscriptionFlowReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// Reconcile drives one SubscriptionFlow toward its effective state.
func (r *SubscriptionFlowReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var flow subflowv1.SubscriptionFlow
	if err := r.Get(ctx, req.NamespacedName, &flow); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler with the manager.
func (r *SubscriptionFlowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&subflowv1.SubscriptionFlow{}).
		Named("subscriptionflow").
		Complete(r)
}
