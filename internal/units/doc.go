// Package units checks the systemd units shipped in systemd/ with systemd-analyze verify (a
// real validator) and pins the directives operators rely on. It has no code of its own.
package units
