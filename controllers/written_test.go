package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestWrittenBookWaitsOnlyForTheVersionsBeforeAWrite(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "flow"}
	now := time.Unix(1000, 0)
	var b writtenBook
	if b.stale(key, "1", now) {
		t.Fatal("a flow never written is stale")
	}
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

	b.wrote(key, []string{"3"}, now)
	if b.stale(key, "3", now.Add(cacheWait)) {
		t.Error("a write the cache has not shown for cacheWait still holds the flow")
	}
	b.wrote(key, []string{"4"}, now)
	b.forget(key)
	if b.stale(key, "4", now) {
		t.Error("a forgotten flow is stale")
	}
}

func TestWrittenBookHoldsEveryVersionWhileAWriteIsInFlight(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "flow"}
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	now := time.Unix(1000, 0)
	var b writtenBook
	b.writing(key)
	for _, v := range []string{"1", "2"} {
		if !b.stale(key, v, now.Add(10*cacheWait)) {
			t.Errorf("version %s is not stale while a write is in flight", v)
		}
	}
	if b.stale(other, "1", now) {
		t.Error("another flow waits for this flow's write")
	}
	b.wrote(key, []string{"1"}, now)
	if !b.stale(key, "1", now) || b.stale(key, "2", now) {
		t.Error("after the write only the version read before it is stale")
	}
	b.writing(key)
	b.forget(key) // the write was refused: nothing to wait for
	if b.stale(key, "1", now) {
		t.Error("a refused write still holds the flow")
	}
}
