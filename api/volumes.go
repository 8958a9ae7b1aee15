package api

import "time"

// VolumeMount mounts a team's volume, by name, at Path inside a new
// sandbox (NewSandbox.VolumeMounts); echoed in SandboxDetail.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// NewVolume is POST /volumes.
type NewVolume struct {
	Name string `json:"name"`
	// SizeMB is the volume's size limit in MiB (fence's extension); zero
	// takes the daemon's default.
	SizeMB int64 `json:"sizeMB,omitempty"`
}

// Volume is an entry of GET /volumes.
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// VolumeAndToken is POST /volumes and GET /volumes/{volumeID}: the volume
// and a new bearer token for its content API.
type VolumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
	// SizeMB is the volume's size limit in MiB (fence's extension).
	SizeMB int64 `json:"sizeMB"`
}

// VolumeEntryStat is what the volume content API says of a file,
// directory or symlink.
type VolumeEntryStat struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // "file" | "directory" | "symlink" | "unknown"
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits only
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// VolumeMetadata is PATCH /volumecontent/{volumeID}/path.
type VolumeMetadata struct {
	UID  *uint32 `json:"uid,omitempty"`
	GID  *uint32 `json:"gid,omitempty"`
	Mode *uint32 `json:"mode,omitempty"`
}
