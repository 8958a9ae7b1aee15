package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Report is what Verify found.
type Report struct {
	Segments          int
	Records           uint64
	FirstSeq, LastSeq uint64
	Checkpoints       int
	// LastCheckpoint is the seq of the last checkpoint record; Unsigned
	// counts the records after it, which no signature covers.
	LastCheckpoint uint64
	Unsigned       uint64
	// Warnings are facts a reader should know that do not break the
	// chain: torn lines cut after a crash, dropped events, an unsigned
	// tail.
	Warnings []string
	// Break is the first place the log is not what the writer wrote; nil
	// when intact.
	Break *Break
}

// Break names the first broken record.
type Break struct {
	Segment string // file name
	Line    int    // 1-based line in Segment
	Seq     uint64 // the record's seq (or the seq expected there)
	Reason  string
}

func (b *Break) Error() string {
	return fmt.Sprintf("audit log broken at %s line %d (seq %d): %s", b.Segment, b.Line, b.Seq, b.Reason)
}

type loc struct {
	seg  string
	line int
	seq  uint64
}

// Verify checks the audit log of dataDir against the public key pub: every
// line is a well-formed record, seqs are contiguous, each prev is the hash
// of the line before, each checkpoint is signed by pub over the record
// before it, the log starts at seq 1 or where a prune record says, and it
// reaches the last checkpoint the daemon recorded apart (the head). It
// returns the report and, when the log is broken, the *Break (also in
// Report.Break); other errors are I/O.
//
// What it cannot detect: records after the last checkpoint can be cut or
// rewritten by whoever can write the files (see Report.Unsigned; the head
// narrows this to the last second of checkpoints); and whoever holds the
// signing key can rewrite everything. Verifying with a public key kept
// off the host, and forwarding records off the host, answer both.
func Verify(dataDir string, pub ed25519.PublicKey) (Report, error) {
	dir := filepath.Join(dataDir, LogDir)
	var rep Report
	// The head first: a daemon writes it only after the segments hold
	// what it names, so segments listed and read after it reach it.
	hd, err := readHead(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("the head file is unreadable: %v", err))
	}
	segs, err := listSegments(dir)
	if err != nil {
		return rep, err
	}
	wantID := keyID(pub)
	v := &verifier{rep: &rep, pub: pub, wantID: wantID, head: hd, segs: segs}
	for i, s := range segs {
		if v.brk != nil {
			break
		}
		rep.Segments++
		f, err := os.Open(filepath.Join(dir, s.name))
		if err != nil {
			return rep, err
		}
		lr := newLineReader(f)
		first := true
		for v.brk == nil {
			l, err := lr.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				v.fail(loc{s.name, lr.n + 1, v.expect}, err.Error())
				break
			}
			at := loc{s.name, lr.n, v.expect}
			if first {
				first = false // the first segment's start is checked by record()
				if r, err := parseLine(l); err == nil && i > 0 && r.Seq != s.first {
					v.fail(loc{s.name, lr.n, r.Seq}, fmt.Sprintf("the segment's name says its first record is seq %d", s.first))
					break
				}
			}
			v.record(at, l)
		}
		if st, err := f.Stat(); err == nil && st.Size() > lr.off && v.brk == nil {
			if i == len(segs)-1 {
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s ends with %d bytes of an incomplete line (a write in progress, or a crash: the daemon cuts it at its next start)", s.name, st.Size()-lr.off))
			} else {
				v.fail(loc{s.name, lr.n + 1, v.expect}, "an incomplete line in a sealed segment")
			}
		}
		f.Close()
	}
	v.finish()
	rep.Break = v.brk
	if v.brk != nil {
		return rep, v.brk
	}
	return rep, nil
}

type verifier struct {
	rep    *Report
	pub    ed25519.PublicKey
	wantID string
	head   *head
	brk    *Break

	expect   uint64 // the next seq; 0 before the first record
	prevHash string
	prevLoc  loc
	// A prev mismatch between prevLoc (record N) and the record after it
	// (N+1): which one changed is decided by the record after N+1.
	mismatch     *[2]loc
	mismatchHash string // hash of record N+1
	start        *struct {
		at   loc
		prev string
	} // a first record after seq 1, until a prune record accounts for it
	headSeen bool
	drops    int64
	// segs are the segments listed; pruneAt is the prune record that
	// accounts for a start after seq 1, until a later checkpoint signs it.
	segs       []segment
	pruneAt    *loc
	revoked    *loc // a prune record the daemon found unsigned at start
	suppressed int64
}

func (v *verifier) fail(at loc, reason string) {
	if v.brk == nil {
		v.brk = &Break{Segment: at.seg, Line: at.line, Seq: at.seq, Reason: reason}
	}
}

func (v *verifier) record(at loc, l []byte) {
	r, err := parseLine(l)
	if err != nil {
		v.fail(at, "not a well-formed record: "+err.Error())
		return
	}
	at.seq = r.Seq
	h := hexHash(l)
	if !v.link(at, r, h) {
		return
	}
	v.rep.Records++
	v.rep.LastSeq = r.Seq
	if !v.typed(at, r) {
		return
	}
	if v.head != nil && r.Seq == v.head.Seq {
		v.headSeen = true
		if h != v.head.Hash {
			v.fail(at, "record differs from the one the last recorded checkpoint (head) signed")
			return
		}
	}
	v.expect = r.Seq + 1
	v.prevHash = h
	v.prevLoc = at
}

// link checks that record r (hash h) at at follows the record before it:
// its seq is the next one and its prev that record's hash, or, for the
// first record, it starts the chain. It reports whether r is to be
// counted; a prev mismatch is held until the record after r tells which
// of the two was altered.
func (v *verifier) link(at loc, r Record, h string) bool {
	if m := v.mismatch; m != nil {
		if r.Seq == m[1].seq+1 && r.Prev == v.mismatchHash {
			v.fail(m[0], fmt.Sprintf("record %d was altered: its hash is not the prev that record %d holds", m[0].seq, m[1].seq))
		} else {
			v.fail(m[1], fmt.Sprintf("record %d was altered: its prev is not the hash of record %d, and its hash not the prev of the record after it", m[1].seq, m[0].seq))
		}
		return false
	}
	switch {
	case v.expect == 0:
		v.rep.FirstSeq = r.Seq
		if r.Seq == 1 {
			if r.Prev != genesis {
				v.fail(at, "the first record's prev is not the genesis (zeros)")
				return false
			}
		} else {
			v.start = &struct {
				at   loc
				prev string
			}{at, r.Prev}
		}
	case r.Seq > v.expect:
		v.fail(loc{at.seg, at.line, v.expect}, fmt.Sprintf("records %d to %d are missing here (deleted, or moved): found seq %d", v.expect, r.Seq-1, r.Seq))
		return false
	case r.Seq < v.expect:
		v.fail(at, fmt.Sprintf("seq %d where %d was expected: records were reordered or duplicated", r.Seq, v.expect))
		return false
	case r.Prev != v.prevHash:
		v.mismatch = &[2]loc{v.prevLoc, at}
		v.mismatchHash = h
		return false
	}
	return true
}

// typed checks what record r's type says (checkpoints, prunes, a cut-back
// log) and counts what it reports (recoveries, drops, suppressions); it
// reports false when r breaks the log.
func (v *verifier) typed(at loc, r Record) bool {
	switch r.Type {
	case TypeCheckpoint:
		v.checkpoint(at, r)
	case TypePrune:
		return v.prune(at, r)
	case TypeTruncated:
		var d struct {
			HeadSeq uint64 `json:"head_seq"`
			LastSeq uint64 `json:"last_seq"`
		}
		json.Unmarshal(r.Data, &d)
		v.fail(at, fmt.Sprintf("the daemon found the log cut back when it started: it ended at seq %d, but seq %d had been signed (records were removed)", d.LastSeq, d.HeadSeq))
		return false
	case TypeRecovered:
		v.recovered(r)
	case TypeDropped:
		var d struct {
			Count int64 `json:"count"`
		}
		json.Unmarshal(r.Data, &d)
		v.drops += d.Count
	case TypeSuppressed:
		var d struct {
			Total int64 `json:"total"`
		}
		json.Unmarshal(r.Data, &d)
		v.suppressed += d.Total
	}
	return true
}

// prune notes a prune record that accounts for the log's start after seq
// 1, to be accepted once a later checkpoint signs it; it reports false
// when the record does not agree with the segment names.
func (v *verifier) prune(at loc, r Record) bool {
	var d struct {
		Segment   string `json:"segment"`
		FirstKept uint64 `json:"first_kept"`
		Prev      string `json:"prev"`
	}
	if json.Unmarshal(r.Data, &d) == nil && v.start != nil && d.FirstKept == v.start.at.seq && d.Prev == v.start.prev {
		if why := v.pruneDisagrees(d.Segment, d.FirstKept); why != "" {
			v.fail(at, "the prune record does not agree with the segment names: "+why)
			return false
		}
		// Accepted once a later checkpoint signs it (see checkpoint).
		v.pruneAt = &at
	}
	return true
}

// recovered warns of what the daemon repaired at its start, and revokes
// the pending prune record when it is one the daemon found unsigned.
func (v *verifier) recovered(r Record) {
	var d struct {
		UnsignedPrune uint64 `json:"unsigned_prune"`
	}
	if json.Unmarshal(r.Data, &d) == nil && d.UnsignedPrune != 0 && v.pruneAt != nil && v.pruneAt.seq == d.UnsignedPrune {
		// Not the daemon's (or cut short by a crash, and then the
		// daemon's next prune of the same segment accounts for it).
		v.revoked, v.pruneAt = v.pruneAt, nil
	}
	if d.UnsignedPrune != 0 {
		v.rep.Warnings = append(v.rep.Warnings, fmt.Sprintf("seq %d: the daemon found a prune record no checkpoint signed (%s)", r.Seq, string(r.Data)))
		return
	}
	v.rep.Warnings = append(v.rep.Warnings, fmt.Sprintf("seq %d: the daemon cut a torn final line after a crash (%s)", r.Seq, string(r.Data)))
}

func (v *verifier) checkpoint(at loc, r Record) {
	var d struct {
		Seq  uint64 `json:"seq"`
		Hash string `json:"hash"`
		Sig  string `json:"sig"`
		Key  string `json:"key"`
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		v.fail(at, "a checkpoint without its fields")
		return
	}
	if d.Seq != r.Seq-1 || d.Hash != r.Prev {
		v.fail(at, fmt.Sprintf("the checkpoint covers seq %d, not the record before it", d.Seq))
		return
	}
	if d.Key != v.wantID {
		v.fail(at, fmt.Sprintf("the checkpoint is signed by key %s, not by the verifying key %s", d.Key, v.wantID))
		return
	}
	hash, err1 := hex.DecodeString(d.Hash)
	sig, err2 := base64.StdEncoding.DecodeString(d.Sig)
	if err1 != nil || err2 != nil || !ed25519.Verify(v.pub, checkpointMessage(d.Seq, hash), sig) {
		v.fail(at, "the checkpoint's signature does not verify")
		return
	}
	v.rep.Checkpoints++
	v.rep.LastCheckpoint = r.Seq
	if v.pruneAt != nil && v.start != nil {
		// The checkpoint signs the chain up to it, the prune record
		// included: the records before the start were pruned.
		v.start, v.pruneAt = nil, nil
	}
}

// pruneDisagrees says why a prune record that names first as the first
// record kept and seg as the segment removed does not fit the segments
// listed ("" when it fits): the first segment must be named for first, and
// seg must be a segment name before it that is not there any more.
func (v *verifier) pruneDisagrees(seg string, first uint64) string {
	if len(v.segs) == 0 || v.segs[0].first != first {
		return fmt.Sprintf("it says the log starts at seq %d, but the first segment is not named for it", first)
	}
	removed, err := parseSegName(seg)
	if err != nil || removed >= first {
		return fmt.Sprintf("it names %q as the segment removed, not a segment before seq %d", seg, first)
	}
	return ""
}

func (v *verifier) finish() {
	rep := v.rep
	if v.brk == nil && v.mismatch != nil {
		m := v.mismatch
		v.fail(m[0], fmt.Sprintf("the hash chain breaks between records %d and %d: one of them was altered", m[0].seq, m[1].seq))
	}
	if v.brk == nil && v.start != nil && v.pruneAt == nil && v.revoked != nil {
		v.fail(*v.revoked, fmt.Sprintf("the prune record that accounts for the records before seq %d was unsigned when the daemon started: the daemon signs each prune record as it writes it", v.start.at.seq))
	}
	if v.brk == nil && v.start != nil && v.pruneAt != nil {
		v.fail(*v.pruneAt, fmt.Sprintf("the prune record that accounts for the records before seq %d is not signed by any later checkpoint", v.start.at.seq))
	}
	if v.brk == nil && v.start != nil {
		v.fail(v.start.at, fmt.Sprintf("records before seq %d are missing and no prune record accounts for them", v.start.at.seq))
	}
	if v.brk == nil && v.head != nil && !v.headSeen {
		if v.head.Seq > rep.LastSeq {
			v.fail(v.prevLoc, fmt.Sprintf("the log ends at seq %d, but a checkpoint over seq %d was recorded: records were removed from the end", rep.LastSeq, v.head.Seq))
		}
	}
	if v.drops > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d events were dropped by the daemon (its queue was full); the drops are recorded", v.drops))
	}
	if v.suppressed > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%d sandbox-driven events were over their sandbox's allowance; audit.suppressed records count them", v.suppressed))
	}
	if rep.Records > 0 {
		rep.Unsigned = rep.LastSeq - rep.LastCheckpoint
		if rep.LastCheckpoint == 0 {
			rep.Unsigned = rep.Records
		}
	}
	if v.brk == nil && rep.Unsigned > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("records after the last checkpoint are unsigned (%d records, seq %d to %d): cutting or rewriting them is not detectable from the log alone",
			rep.Unsigned, rep.LastSeq-rep.Unsigned+1, rep.LastSeq))
	}
}
