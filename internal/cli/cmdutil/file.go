package cmdutil

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxInputFile bounds -f files and standard input alike; the controller itself accepts at
// most 1 MiB bodies. A device such as /dev/zero stops at the bound instead of filling memory.
const maxInputFile = 4 << 20

// ReadYAMLOrJSON reads a YAML or JSON document (JSON is YAML) from path, or from in when
// path is "-". A missing -f or an unreadable path is a FlagError; bad content is an
// InputError that never quotes the file's content (-f may name a file of secrets).
func ReadYAMLOrJSON(in io.Reader, path string) (any, error) {
	if path == "" {
		return nil, FlagErrorf("-f FILE is required")
	}
	r := in
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, FlagErrorf("-f: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxInputFile+1))
	if err != nil {
		return nil, FlagErrorf("-f %s: %w", path, err)
	}
	if len(b) > maxInputFile {
		return nil, InputErrorf("%s is larger than %d bytes", path, maxInputFile)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, InputErrorf("%s is not valid YAML or JSON: %s", path, yamlErrorWithoutContent(err))
	}
	if doc == nil {
		return nil, InputErrorf("%s is empty", path)
	}
	return doc, nil
}

// yamlErrorWithoutContent keeps a YAML error's position and kind but drops any quoted
// value from the document (yaml.v3 quotes values in `backticks`).
func yamlErrorWithoutContent(err error) string {
	return regexp.MustCompile("`[^`]*`").ReplaceAllString(err.Error(), "(value)")
}

var fieldNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,63}$`)

// KeyNames lists keys for an error message: each one that looks like a field name as it is,
// the rest only counted, so a file that is not a slot map (or an image, ...) is not echoed.
func KeyNames(keys []string) string {
	var named []string
	other := 0
	for _, k := range keys {
		if fieldNameRE.MatchString(k) {
			named = append(named, k)
		} else {
			other++
		}
	}
	if other > 0 {
		named = append(named, fmt.Sprintf("%d key(s) that are not field names", other))
	}
	return strings.Join(named, ", ")
}

// DecodeStrict converts a decoded YAML/JSON document into v by the API's JSON field names,
// rejecting unknown keys: a typo must not silently drop a field. name labels errors.
func DecodeStrict(doc any, v any, name string) error {
	j, err := json.Marshal(doc)
	if err != nil {
		return InputErrorf("%s: %w", name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return InputErrorf("%s: %s", name, jsonErrorInOurWords(err))
	}
	return nil
}

// jsonErrorInOurWords turns encoding/json's messages into ours, without the document's
// content: an unknown field is named only when it looks like a field name.
func jsonErrorInOurWords(err error) string {
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ := strconv.Unquote(f)
		return "unknown field " + KeyNames([]string{name})
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		where := te.Field
		if where == "" {
			return fmt.Sprintf("the document is a %s where an object or list was expected", te.Value)
		}
		if te.Value == "number" && te.Type.Kind() == reflect.String {
			// YAML reads an unquoted all-digit value (a digest, say) as a number.
			return fmt.Sprintf("field %s: YAML read its value as a number: quote it (%s: \"...\")", where, where)
		}
		return fmt.Sprintf("field %s: a %s is not a %s", where, te.Value, te.Type.String())
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// DecodeFile is ReadYAMLOrJSON followed by DecodeStrict.
func DecodeFile(in io.Reader, path string, v any) error {
	doc, err := ReadYAMLOrJSON(in, path)
	if err != nil {
		return err
	}
	return DecodeStrict(doc, v, path)
}
