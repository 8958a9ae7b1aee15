package native

import (
	"maps"

	"golang.org/x/sys/unix"
)

// The index of a checkpoint's regular files by inode.
//
// A checkpoint from the record of changes examines the files the
// sandbox's processes map shared or hold open for writing, which it knows
// by inode, and the other names of a changed file with several links: it
// finds their keys here, in time proportional to those files, not to the
// layer's entries. The index is built with the walk's index and updated
// with the entries each later checkpoint examined (nextCheckpoint), so
// every regular file of the checkpoint's index is in it under its inode;
// a key it gives is checked against the index of files before use.

// inodeIndex maps inodes to the keys of the regular files indexed with
// them: one key in one, several (a file of several names) in many.
type inodeIndex struct {
	one  map[uint64]string
	many map[uint64]map[string]struct{}
}

func newInodeIndex() inodeIndex {
	return inodeIndex{one: map[uint64]string{}, many: map[uint64]map[string]struct{}{}}
}

// inodesOf indexes the regular files of files by inode.
func inodesOf(files map[string]prevFile) inodeIndex {
	x := newInodeIndex()
	for k, f := range files {
		x.add(k, f)
	}
	return x
}

// clone returns a copy of x that shares nothing with it.
func (x inodeIndex) clone() inodeIndex {
	c := inodeIndex{one: maps.Clone(x.one), many: make(map[uint64]map[string]struct{}, len(x.many))}
	for ino, ks := range x.many {
		c.many[ino] = maps.Clone(ks)
	}
	return c
}

// add indexes key, the entry f, if it is a regular file.
func (x inodeIndex) add(key string, f prevFile) {
	if f.typ != unix.S_IFREG {
		return
	}
	if ks := x.many[f.ino]; ks != nil {
		ks[key] = struct{}{}
		return
	}
	if k, ok := x.one[f.ino]; ok && k != key {
		x.many[f.ino] = map[string]struct{}{k: {}, key: {}}
		delete(x.one, f.ino)
		return
	}
	x.one[f.ino] = key
}

// drop removes key, the entry f, from the index.
func (x inodeIndex) drop(key string, f prevFile) {
	if f.typ != unix.S_IFREG {
		return
	}
	if ks := x.many[f.ino]; ks != nil {
		delete(ks, key)
		if len(ks) == 0 {
			delete(x.many, f.ino)
		}
		return
	}
	if x.one[f.ino] == key {
		delete(x.one, f.ino)
	}
}

// regular calls fn with each key of files that is a regular file of
// inode ino, and counts the keys looked at in *looked.
func (x inodeIndex) regular(files map[string]prevFile, ino uint64, looked *int, fn func(key string)) {
	try := func(k string) {
		*looked++
		if f, ok := files[k]; ok && f.typ == unix.S_IFREG && f.ino == ino {
			fn(k)
		}
	}
	if k, ok := x.one[ino]; ok {
		try(k)
	}
	for k := range x.many[ino] {
		try(k)
	}
}
