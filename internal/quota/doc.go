// Package quota limits the writable disk of each sandbox, enforced by the
// kernel and on disk: each sandbox's writable layer (its overlay upper and
// work dirs) lives in a directory that is its own small ext4 filesystem,
// stored in a sparse image file exactly as large as the limit and mounted
// through a loop device. Writes past the limit fail with ENOSPC.
//
// # Why not project quotas
//
// The first design was one big ext4 filesystem with project quotas. The
// kernels fence runs on are not guaranteed to have quota formats built in
// (this project's VMs have CONFIG_QUOTA but neither CONFIG_QFMT_V2 nor
// CONFIG_XFS_QUOTA nor CONFIG_TMPFS_QUOTA, so ext4 refuses to mount with
// quotas), and btrfs qgroups need btrfs-progs on the host. A filesystem per
// sandbox needs only loop devices, ext4 and mkfs.ext4 (e2fsprogs, present on
// every Debian system), and deleting a sandbox's data is deleting one file.
//
// # Layout
//
//	<imageDir>/<name>.img   sparse ext4 image (no journal: the data does not
//	                        outlive a crash of its sandbox), one per Dir
//	<mountDir>/<name>/      its mount point (nosuid, nodev, discard), where the
//	                        caller creates the overlay's upper and work dirs
//	<imageDir>/.seed-<size>.img
//	                        an empty image formatted once by mkfs.ext4; every
//	                        new image of that size is a sparse copy of its
//	                        allocated blocks (about 150 KiB for 1 GiB), so a
//	                        new filesystem costs no mkfs run
//
// The loop device is set up from Go (LOOP_CONFIGURE, direct I/O,
// LO_FLAGS_AUTOCLEAR), so it goes away by itself when the filesystem is
// unmounted. The device is the one after the last bound when the kernel
// finds it unbound (LOOP_CONFIGURE refuses a bound one), else the one
// LOOP_CTL_GET_FREE gives: that search goes over every bound device on
// the host, a cost that grew with the sandboxes alive. With the discard mount option, space freed
// inside is returned to the host file system.
//
// # Guarantees
//
//   - NewDir either returns a mounted, limited directory or an error after
//     removing everything it made. An image appears under its final name
//     only once complete (copied in full from a seed that mkfs made).
//   - RemoveDir is idempotent and also cleans what a crash left behind
//     (an image without a mount, a mount without a sandbox, a temporary
//     image); Dirs lists every name that needs it, for reconciliation on
//     start. Mounts persist across a restart without a pool; a pool's Open
//     starts from a clean MountDir (see Open).
//   - ImageDir and MountDir may be reached through symlinks: Open resolves
//     them once, and every mount check, unmount and loop device comparison
//     uses the kernel's spelling. Open unmounts every mount stacked at
//     MountDir when there is more than one (or a pool starts), and releases
//     loop devices backed by an image under ImageDir that is gone; loop
//     devices backed by anything else are never touched.
//   - Nothing follows a symlink: names are single path elements validated
//     here, and leftovers are removed with os.RemoveAll, which does not
//     follow symlinks.
//   - Every fd is close-on-exec; mkfs runs with a context, SIGTERM on
//     cancellation and a bounded WaitDelay.
//
// # Not done here
//
// The limit is the filesystem's size: metadata (inode tables, about 3%)
// comes out of it. The inode count is one per 8 KiB of limit. Where loop
// devices, ext4 or mkfs.ext4 are missing or mount is not permitted, Open and
// NewDir fail with an error wrapping ErrUnsupported, and the caller may fall
// back to an unlimited writable layer.
package quota
