package api

// maxJSONDepth bounds how deeply a request body nests objects and arrays. No request type
// needs more than a handful of levels; free-form fields (capacity_metadata, host facts) are
// stored and printed back, and a 5,000-deep value costs megabytes to print indented.
const maxJSONDepth = 32

// checkJSONText refuses, before decoding, what PostgreSQL or a reader would choke on later: a
// NUL character in any string (written \u0000 in JSON; text and jsonb columns refuse it with
// an error the client must never see) and nesting deeper than maxJSONDepth. One pass over the
// bytes: it tracks strings and escapes only, and leaves the JSON grammar to the decoder.
func checkJSONText(body []byte) error {
	depth, inString := 0, false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				if i+5 < len(body) && body[i+1] == 'u' && string(body[i+2:i+6]) == "0000" {
					return errInvalid("request body holds a NUL character (\\u0000) in a string; text fields cannot hold it")
				}
				i++ // the escaped character, whatever it is, cannot end the string
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > maxJSONDepth {
				return errInvalid("request body nests objects and arrays deeper than %d levels", maxJSONDepth)
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}
