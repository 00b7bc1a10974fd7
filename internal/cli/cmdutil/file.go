package cmdutil

import (
	"bytes"
	"encoding/json"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// maxInputFile bounds -f files; the controller itself accepts at most 1 MiB bodies.
const maxInputFile = 4 << 20

// ReadYAMLOrJSON reads a YAML or JSON document (JSON is YAML) from path, or from in when
// path is "-". Problems are FlagErrors: the file is part of the command line.
func ReadYAMLOrJSON(in io.Reader, path string) (any, error) {
	if path == "" {
		return nil, FlagErrorf("-f FILE is required")
	}
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(in, maxInputFile+1))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, FlagErrorf("-f: %w", err)
	}
	if len(b) > maxInputFile {
		return nil, FlagErrorf("%s is larger than %d bytes", path, maxInputFile)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, FlagErrorf("%s: %w", path, err)
	}
	if doc == nil {
		return nil, FlagErrorf("%s is empty", path)
	}
	return doc, nil
}

// DecodeStrict converts a decoded YAML/JSON document into v by the API's JSON field names,
// rejecting unknown keys: a typo must not silently drop a field. name labels errors.
func DecodeStrict(doc any, v any, name string) error {
	j, err := json.Marshal(doc)
	if err != nil {
		return FlagErrorf("%s: %w", name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return FlagErrorf("%s: %w", name, err)
	}
	return nil
}

// DecodeFile is ReadYAMLOrJSON followed by DecodeStrict.
func DecodeFile(in io.Reader, path string, v any) error {
	doc, err := ReadYAMLOrJSON(in, path)
	if err != nil {
		return err
	}
	return DecodeStrict(doc, v, path)
}
