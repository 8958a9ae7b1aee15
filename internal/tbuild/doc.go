// Package tbuild builds templates from E2B build requests (the SDK's
// Template builder, `fence template build -f Dockerfile`): it keeps the
// builds of E2B's template API, runs every build step fenced, and serves
// the result to sandbox creation.
//
// # Parts
//
// Templates have three owners, each a package with its tests:
//
//   - package content, the content store: layer trees, the layer cache,
//     COPY archives and their collection;
//   - package names, the names service: templates, aliases, tags,
//     visibility, and which builds a name may select;
//   - this package, the builds: build records, logs, uploads, and the
//     runs, which use the two above and create their sandboxes through
//     Sandboxes, an interface of this package's own types that the daemon
//     implements over the sandbox manager.
//
// The daemon makes them in two steps around the sandbox manager, which
// resolves templates through the builds and whose sandboxes the builds
// run in: first the Service (records, uploads, logs, and the Catalog the
// manager resolves templates with), which needs no sandboxes; then, once
// the manager is made, the Runner (NewRunner): the Service with the
// manager's Sandboxes, which runs builds (Trigger), deletes templates
// (Delete) and collects the layers no live sandbox uses. The Runner is
// the face the HTTP API sees. Lock order:
// the Service's lock, then the registry's or the store's; neither of
// those calls out while it holds its own.
//
// # How a build runs
//
// The base is a parent template's tree (fromTemplate) or an image the oci
// package unpacks (fromImage, fromImageRegistry). Then E2B's default-user
// phase (user "user" with passwordless sudo), then the steps, in order.
// Every step that touches files (RUN, COPY, WORKDIR, USER) runs inside a
// sandbox made through Sandboxes from the tree built so far, with the
// same isolation and limits as any sandbox and egress limited to the
// build's allowlist (default: the package registries' presets). ENV only
// changes the build context. After each step the sandbox's writable layer
// is read (isolation.LayerReader) and a new tree is made: the start tree
// hard-linked (templates are never written, an overlay copies a file up
// before changing it, so sharing inodes is safe), then the layer applied,
// deletions and opaque directories included, through descriptors that
// never follow a symlink. Sandbox uids (shifted on the host) are mapped
// back; extended attributes (file capabilities) and set-id bits are not
// kept.
//
// # Guarantees
//
//   - The layer cache is keyed like E2B's chain: a step's key hashes the
//     previous key, the step's type and arguments and its files hash, so a
//     change invalidates every later step. A hit is logged as CACHED.
//     Whole-build force bypasses every lookup; a step's force bypasses its
//     own.
//   - Layer trees appear only complete (made in a .tmp- directory and
//     renamed) and are never written afterwards; a crashed daemon's .tmp-
//     leftovers are removed at start. A build that does not finish makes
//     no template: a template build is ready only once every step passed,
//     and builds found waiting or building at start are marked failed.
//   - Build records, tags and templates persist in the store; logs are
//     append-only and indexed by offset.
//   - Uploaded COPY archives are checked (gzip or plain tar, relative
//     paths) before they are kept; a malformed one is a clear error and
//     keeps nothing. They are extracted inside the build sandbox, never on
//     the host.
//   - An upload link takes one PUT. The files hash a client names cannot
//     be recomputed from its archive (E2B's hash covers directories'
//     inode sizes, which a tar does not carry), so the archive kept under
//     a hash is written once: a later upload must hold the same files
//     (names, types, modes, link targets, contents), and a second PUT to
//     one link is refused and drops what the first one kept, since one
//     of the two did not come from the client the link was given to.
//   - A step's cache key length-prefixes every part (type, each
//     argument, files hash); a COPY's also covers the digest of the
//     files it copies, read from the archive the step then copies.
//   - Layer trees no build record, build in progress, create in flight
//     or live sandbox of a deleted template uses are collected at start
//     and after every deletion, crash-safely: the trees, the cache and
//     the archives are package content's; this package tells it what the
//     records name and which sandboxes live (gc.go), under its lock.
//
// Build sandboxes are made through the Sandboxes interface declared here
// (the daemon implements it over the sandbox manager, which marks them
// with sandbox.BuildMetadataKey; the API's sandbox lists leave them out):
// this package does not import internal/sandbox, nor it this one.
package tbuild
