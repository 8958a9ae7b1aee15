// Package content is the content store of template builds: the layer
// trees, the layer cache, the COPY archives clients upload, and their
// collection. It knows nothing of names, builds or sandboxes: its owner
// (package tbuild) tells it what its records name and which sandboxes
// live.
//
// # Layout
//
// A Store owns one directory, Options.Dir:
//
//	trees/<name>/     a layer tree: a template's root filesystem
//	layers/<key>.json the cache: the tree a chain key built (Entry)
//	files/<hash>.tar  a COPY archive, as uploaded, ungzipped
//	deleted.json      the tombstones of deleted templates
//
// # Guarantees
//
//   - A tree appears only complete (made under a .tmp- name, then
//     renamed: Commit, Place) and is never written afterwards, so trees
//     may share files as hard links (CloneTree). A crashed daemon's .tmp-
//     leftovers are removed at Open.
//   - ApplyLayer applies a sandbox's writable layer to a tree through
//     descriptors that never follow a symlink, deletions and opaque
//     directories included; sandbox uids (shifted on the host) are mapped
//     back; extended attributes and set-id bits are not kept.
//   - Cached hands out a cache entry and pins its tree in one step; an
//     entry whose tree is gone is a miss.
//   - Collect keeps every tree a record, pin, recent lease (while creates
//     are in flight) or live tombstone names and removes the rest,
//     crash-safely (gc.go); the store never calls its owner while it
//     holds its lock, so the owner may call it under its own.
//   - An uploaded archive is checked (gzip or plain tar, relative paths,
//     regular files, directories and links only) before it is kept and is
//     written once: a later upload under its hash must hold the same
//     files. Unused archives are removed after a day (files.go).
package content
