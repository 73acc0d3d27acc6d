package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestWrittenBookWaitsOnlyForTheVersionsBeforeAWrite(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "flow"}
	now := time.Unix(1000, 0)
	var b memory
	if b.stale(key, "1", now) {
		t.Fatal("a flow never written is stale")
	}
	b.writing(key)
	b.wrote(key, []string{"1", "2"}, now)
	for _, v := range []string{"1", "2"} {
		if !b.stale(key, v, now.Add(time.Millisecond)) {
			t.Errorf("version %s, read before the write, is not stale", v)
		}
	}
	if b.stale(key, "3", now.Add(time.Millisecond)) {
		t.Error("the written version 3 is stale")
	}
	if b.stale(key, "1", now.Add(time.Millisecond)) {
		t.Error("version 1 is stale again after the cache showed a newer one")
	}

	b.writing(key)
	b.wrote(key, []string{"3"}, now)
	if b.stale(key, "3", now.Add(cacheWait)) {
		t.Error("a write the cache has not shown for cacheWait still holds the flow")
	}
	b.writing(key)
	b.wrote(key, []string{"4"}, now)
	b.forget(key)
	if b.stale(key, "4", now) {
		t.Error("a forgotten flow is stale")
	}
}

func TestWrittenBookDefersReconcilesToAWriteInFlight(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "flow"}
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	now := time.Unix(1000, 0)
	var b memory
	if b.deferToWrite(key) {
		t.Fatal("a flow with no write in flight is deferred")
	}
	b.writing(key)
	if b.wrote(key, []string{"1"}, now) {
		t.Error("a write no reconcile waited for says one did")
	}
	b.writing(key)
	if !b.deferToWrite(key) || !b.deferToWrite(key) {
		t.Fatal("a reconcile during the write is not deferred")
	}
	if b.stale(key, "1", now) {
		t.Error("a deferred flow also polls: stale while a write is in flight")
	}
	if b.deferToWrite(other) {
		t.Error("another flow waits for this flow's write")
	}
	if !b.wrote(key, []string{"1"}, now) {
		t.Error("the write's end does not say a reconcile waited for it")
	}
	if b.deferToWrite(key) || !b.stale(key, "1", now) || b.stale(key, "2", now) {
		t.Error("after the write only the version read before it holds the flow")
	}

	b.writing(key)
	b.deferToWrite(key)
	if !b.ended(key) || b.deferToWrite(key) || b.stale(key, "1", now) {
		t.Error("a refused write leaves the flow held, or forgets the reconcile it deferred")
	}
	b.writing(key)
	b.forget(key) // deleted while its write was in flight
	b.wrote(key, []string{"1"}, now)
	if len(b.flows) != 0 {
		t.Errorf("a deleted flow's write left %v in memory", b.flows)
	}
}
