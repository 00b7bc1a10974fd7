package alloc_test

import "encoding/json"

func jsonRaw(b []byte) json.RawMessage { return json.RawMessage(b) }
