package audit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// head is the last checkpoint, kept apart from the segments so that
// cutting the log's tail back past it is noticed (by Open and by Verify).
type head struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	Sig  string `json:"sig"`
	Key  string `json:"key"`
}

const headFile = "head"

func (l *Log) writeHead() {
	if !l.headDirty {
		return
	}
	if err := writeFileAtomic(filepath.Join(l.dir, headFile), []byte(l.lastCkRec+"\n"), 0o600); err != nil {
		l.log.Warn("audit: writing head", "err", err)
		return
	}
	l.headDirty = false
	l.lastHead = l.opts.Now()
}

func readHead(dir string) (*head, error) {
	b, err := os.ReadFile(filepath.Join(dir, headFile))
	if err != nil {
		return nil, err
	}
	var h head
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	return &h, nil
}
