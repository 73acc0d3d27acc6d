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
