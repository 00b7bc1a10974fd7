package rules

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// secretWords name values that are credentials: comparing one with == leaks, through timing,
// how many leading bytes matched. Ids and hashes of credentials are not secrets.
var secretWords = []string{"token", "secret", "password", "passwd", "signature", "hmac", "apikey"}

// notSecret are names that contain a secret word but hold no credential.
var notSecret = map[string]string{
	"WithToken":          "configcmd: a bool flag (read the token from standard input)",
	"RefuseBadSignature": "task: a refusal reason constant",
}

func secretName(e ast.Expr) (string, bool) {
	var name string
	switch v := e.(type) {
	case *ast.Ident:
		name = v.Name
	case *ast.SelectorExpr:
		name = v.Sel.Name
	case *ast.CallExpr: // string(tok), strings.TrimSpace(secret); not len(sig)
		if fn, ok := v.Fun.(*ast.Ident); ok && (fn.Name == "len" || fn.Name == "cap") {
			return "", false
		}
		if len(v.Args) == 1 {
			return secretName(v.Args[0])
		}
		return "", false
	default:
		return "", false
	}
	if notSecret[name] != "" {
		return "", false
	}
	l := strings.ToLower(name)
	for _, harmless := range []string{"id", "hash", "header", "file", "path", "source", "ttl", "len", "kind", "type"} {
		if strings.HasSuffix(l, harmless) {
			return "", false
		}
	}
	for _, w := range secretWords {
		if strings.Contains(l, w) {
			return name, true
		}
	}
	return "", false
}

// trivial reports operands a secret may be compared with in plain Go: the empty string, nil.
func trivial(e ast.Expr) bool {
	switch v := e.(type) {
	case *ast.BasicLit:
		return v.Value == `""`
	case *ast.Ident:
		return v.Name == "nil"
	}
	return false
}

// TestSecretsAreComparedInConstantTime fails on `==`/`!=` between a credential and anything
// but "" or nil outside tests: compare with crypto/subtle, or look the credential up by its
// SHA-256 (pki.HashToken) as API, bootstrap and terminal tokens are.
func TestSecretsAreComparedInConstantTime(t *testing.T) {
	for dir, files := range packages(t) {
		for _, f := range files {
			fset := token.NewFileSet()
			af, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(af, func(n ast.Node) bool {
				b, ok := n.(*ast.BinaryExpr)
				if !ok || (b.Op != token.EQL && b.Op != token.NEQ) {
					return true
				}
				for _, pair := range [][2]ast.Expr{{b.X, b.Y}, {b.Y, b.X}} {
					if name, secret := secretName(pair[0]); secret && !trivial(pair[1]) {
						t.Errorf("%s (%s): %s compared with %s; use crypto/subtle or a hash lookup", fset.Position(b.Pos()), dir, name, b.Op)
					}
				}
				return true
			})
		}
	}
}
