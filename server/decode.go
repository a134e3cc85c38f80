package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// DecodeJSON decodes exactly one JSON object from r into v, rejecting
// unknown fields, null values and trailing data; an empty body is the
// empty object {}. Failures are 400 errors that name the field (413 when
// r is a capped body that overflowed). Exported for fuzzing.
func DecodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return err
		case errors.Is(err, io.EOF):
			raw = json.RawMessage("{}")
		default:
			return errf(400, "bad_request", "malformed JSON: %v", err)
		}
	} else if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return errf(400, "bad_request", "trailing data after the JSON object")
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return errf(400, "bad_request", "malformed JSON: %v", err)
	}
	if _, ok := tree.(map[string]any); !ok {
		return errf(400, "bad_request", "the request body must be a JSON object, not %s", jsonKind(tree))
	}
	if p := findNull(tree, ""); p != "" {
		return errf(400, "bad_request", "field %q is null: give a value or leave the field out", p)
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field
			if field == "" {
				field = "(body)"
			}
			return errf(400, "bad_request", "field %q must be %s, not %s", field, jsonTypeOf(te.Type), te.Value)
		}
		if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
			return errf(400, "bad_request", "unknown field %s", strings.TrimPrefix(msg, "json: unknown field "))
		}
		return errf(400, "bad_request", "invalid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// findNull returns the path (a.b.0) of the first null in v, or "".
func findNull(v any, at string) string {
	join := func(k string) string {
		if at == "" {
			return k
		}
		return at + "." + k
	}
	switch t := v.(type) {
	case nil:
		return at
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p := findNull(t[k], join(k)); p != "" {
				return p
			}
		}
	case []any:
		for i, e := range t {
			if p := findNull(e, join(strconv.Itoa(i))); p != "" {
				return p
			}
		}
	}
	return ""
}

// jsonKind names the JSON type of a decoded value.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// jsonTypeOf names the JSON type a Go type decodes from.
func jsonTypeOf(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a " + t.String()
}
