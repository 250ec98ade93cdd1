package mcp

import "testing"

func TestAtPointer(t *testing.T) {
	doc := []byte(`{"a":{"b/c":[1,{"d~e":"x"}],"":0},"n":null,"list":[10,20]}`)
	for _, c := range []struct {
		ptr, want string
		ok        bool
	}{
		{"", string(doc), true},
		{"/a/b~1c/1/d~0e", `"x"`, true},
		{"/a/b~1c/0", `1`, true},
		{"/a/", `0`, true},
		{"/n", `null`, true},
		{"/list/1", `20`, true},
		{"/list/2", "", false},
		{"/list/-", "", false},
		{"/list/01", "", false},
		{"/list/+1", "", false},
		{"/missing", "", false},
		{"/n/x", "", false},
		{"a", "", false},
	} {
		v, ok := atPointer(doc, c.ptr)
		if ok != c.ok || string(v) != c.want {
			t.Errorf("atPointer(%q) = %s, %v; want %s, %v", c.ptr, v, ok, c.want, c.ok)
		}
	}
}

func TestLeanWait(t *testing.T) {
	changed := []byte(`{"status":"changed","stateAfter":{"count":42,"todos":[{"done":true}]}}`)
	for _, c := range []struct {
		raw  []byte
		path string
		want string // "" = pass on as it came
	}{
		{changed, "/count", `{"status":"changed","value":42}`},
		{changed, "/todos/0", `{"status":"changed","value":{"done":true}}`},
		{changed, "/gone", `{"status":"changed","found":false,"next":"Nothing is at path now (it was removed); observe shows the whole state."}`},
		{changed, "", ""},
		{[]byte(`{"status":"timeout"}`), "/count", ""},
		{[]byte(`not json`), "/count", ""},
	} {
		if got := leanWait(c.raw, c.path); string(got) != c.want {
			t.Errorf("leanWait(%s, %q) = %s, want %s", c.raw, c.path, got, c.want)
		}
	}
}
