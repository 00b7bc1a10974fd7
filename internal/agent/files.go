package agent

import (
	"os"
	"path/filepath"

	"github.com/gpuaas/gpuaas/internal/pki"
)

func writeAtomic(path string, data []byte, perm os.FileMode) error {
	return pki.WriteFileAtomic(path, data, perm)
}

func mkdirWrite(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeAtomic(path, data, 0o600)
}
