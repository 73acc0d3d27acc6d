// Package argocd tests the Argo CD health check and resource actions of SubscriptionFlow: the
// Lua scripts run in gopher-lua, the interpreter Argo CD embeds, with only the libraries Argo CD
// opens for a script configured in argocd-cm.
package argocd

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// runLua runs script with obj as the global obj and returns what it returned. Like Argo CD for a
// script of argocd-cm (without resource.customizations.useOpenLibs), it opens the package, base
// and table libraries only: a script that calls string, math, io or os fails here as it would
// there. A script gets a second, as Argo CD gives it.
func runLua(t *testing.T, script string, obj map[string]any) any {
	t.Helper()
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for name, open := range map[string]lua.LGFunction{
		lua.LoadLibName: lua.OpenPackage, lua.BaseLibName: lua.OpenBase, lua.TabLibName: lua.OpenTable,
	} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(open), Protect: true}, lua.LString(name)); err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("lua: %v", err)
	}
	return fromLua(L.Get(-1))
}

// toLua converts an object as Argo CD hands it to a script: numbers are Lua numbers, lists are
// arrays, maps are tables keyed by string.
func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []any:
		arr := L.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(toLua(L, item))
		}
		return arr
	case map[string]any:
		tbl := L.CreateTable(0, len(v))
		for k, item := range v {
			tbl.RawSetString(k, toLua(L, item))
		}
		return tbl
	}
	panic(fmt.Sprintf("toLua: %T", v))
}

// fromLua converts a returned value back: a table with keys 1..n is a list, any other a map. An
// empty table is an empty map (Argo CD repairs the same ambiguity against the original object).
func fromLua(v lua.LValue) any {
	switch v := v.(type) {
	case *lua.LNilType:
		return nil
	case lua.LBool:
		return bool(v)
	case lua.LString:
		return string(v)
	case lua.LNumber:
		return float64(v)
	case *lua.LTable:
		if n := v.MaxN(); n > 0 && n == countKeys(v) {
			list := make([]any, 0, n)
			for i := 1; i <= n; i++ {
				list = append(list, fromLua(v.RawGetInt(i)))
			}
			return list
		}
		m := map[string]any{}
		v.ForEach(func(k, item lua.LValue) { m[k.String()] = fromLua(item) })
		return m
	}
	panic(fmt.Sprintf("fromLua: %s", v.Type()))
}

func countKeys(t *lua.LTable) int {
	n := 0
	t.ForEach(func(lua.LValue, lua.LValue) { n++ })
	return n
}

// health runs health.lua on obj and returns the status and message it reports.
func health(t *testing.T, obj map[string]any) (string, string) {
	t.Helper()
	out, ok := runLua(t, readFile(t, "health.lua"), obj).(map[string]any)
	if !ok {
		t.Fatalf("health.lua returned %T, want a table", out)
	}
	status, _ := out["status"].(string)
	message, _ := out["message"].(string)
	switch status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
	default:
		t.Fatalf("health.lua returned status %q, which Argo CD replaces by Unknown", status)
	}
	return status, message
}

// loadFixture reads a YAML object as the API server would serve it (integers as int64).
func loadFixture(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := yaml.YAMLToJSON([]byte(readFile(t, "testdata/"+name)))
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return u.Object
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
