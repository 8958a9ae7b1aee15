// Package names is the names service of built templates: their records
// (ID, alias, visibility, tags, persisted in the store's template docs)
// and which of their builds are ready, so that a name resolves to a build.
// It knows nothing of trees or sandboxes; package tbuild, which runs the
// builds, tells it when one is ready.
//
// # Names
//
// A name is [namespace/]alias[:tag] (ParseName, as E2B parses it); no tag
// means DefaultTag. A template is found by its ID or its alias; a namespace
// other than the server's finds nothing.
//
// # Guarantees
//
//   - A name resolves only to a ready build of its template: the build a
//     tag points at, or the ready build whose ID the tag is. Tags are set
//     only on ready builds (Publish, AssignTags), and a template's ready
//     builds are forgotten with it.
//   - An alias is one template's: claiming it again gives that template;
//     an alias that is another template's ID is a conflict.
//   - Tags are [a-z0-9_.-]+ and never a UUID; the default tag cannot be
//     removed. Bad input is an error wrapping api.ErrInvalidArgument and
//     changes nothing.
//   - The registry is safe for concurrent use and never calls out while
//     it holds its lock, so its callers may call it under their own.
//     Claim, Publish and Forget change memory only: their caller, which
//     makes them atomic with its own records, persists them (Save, Erase)
//     once it holds no lock; every other change is persisted before its
//     method returns.
package names
