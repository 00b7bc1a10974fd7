package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// walShare is the WAL one relation (or, with no block, one record kind) took in a run.
type walShare struct {
	name           string
	bytes, records int64
	fpi            int64 // of bytes, the full-page images (what the first change of a page after a checkpoint adds)
}

var (
	walLenRE  = regexp.MustCompile(`^rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+),.*?desc: (\S+)`)
	walRelRE  = regexp.MustCompile(`blkref #0: rel \d+/\d+/(\d+)`)
	walNameRE = regexp.MustCompile(`[^a-z0-9_]`)
)

// walKinds: break each relation's WAL down further by record kind (insert, hot_update, lock...).
var walKinds bool

// walByRelation reads the WAL between two insert positions with pg_waldump and sums each
// record's size by the relation its first block belongs to (records without a block, such
// as commits, by resource manager and kind), largest first (full-page images left out).
func walByRelation(ctx context.Context, env *benchenv.Env, from, to string) ([]walShare, error) {
	dirs, err := filepath.Glob(filepath.Join(env.Dir, "*", "*", "pg_wal"))
	if err != nil || len(dirs) == 0 {
		return nil, fmt.Errorf("pg_wal not found under %s", env.Dir)
	}
	names := map[string]string{}
	rows, err := env.DB.Query(ctx, `SELECT relfilenode::text, relname FROM pg_class WHERE relfilenode <> 0`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var node, name string
		if err := rows.Scan(&node, &name); err != nil {
			rows.Close()
			return nil, err
		}
		names[node] = name
	}
	rows.Close()
	out, err := exec.CommandContext(ctx, "/usr/lib/postgresql/15/bin/pg_waldump", "-p", dirs[0], "-s", from, "-e", to).Output()
	if err != nil && len(out) == 0 {
		return nil, fmt.Errorf("pg_waldump: %w", err)
	}
	sum := map[string]*walShare{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := walLenRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rec, _ := strconv.ParseInt(m[2], 10, 64)
		n, _ := strconv.ParseInt(m[3], 10, 64)
		key := m[1] + " " + walNameRE.ReplaceAllString(strings.ToLower(m[4]), "")
		if r := walRelRE.FindStringSubmatch(line); r != nil {
			key = names[r[1]]
			if key == "" {
				key = "relfilenode " + r[1] // another database's (the minimal reference's)
			}
			if walKinds {
				key += " " + m[1] + "/" + walNameRE.ReplaceAllString(strings.ToLower(m[4]), "")
			}
		}
		s := sum[key]
		if s == nil {
			s = &walShare{name: key}
			sum[key] = s
		}
		s.bytes += n
		s.fpi += n - rec
		s.records++
	}
	list := make([]walShare, 0, len(sum))
	for _, s := range sum {
		list = append(list, *s)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].bytes-list[i].fpi > list[j].bytes-list[j].fpi })
	return list, nil
}
