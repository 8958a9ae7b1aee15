package store

import (
	"context"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// migrationOwners gives every sandbox, secret and snapshot record its
// team; records made before teams belong to the default team. Secret
// and snapshot names are unique within a team only (SQLite cannot drop a
// UNIQUE constraint, so both tables are made again with the same rows).
const migrationOwners = `ALTER TABLE sandboxes ADD COLUMN team TEXT NOT NULL DEFAULT '` + tenancy.DefaultTeamID + `';
	CREATE INDEX sandboxes_team ON sandboxes (team, state);
	CREATE TABLE secrets_new (
		id         TEXT PRIMARY KEY,
		team       TEXT NOT NULL DEFAULT '` + tenancy.DefaultTeamID + `',
		name       TEXT NOT NULL,
		version    INTEGER NOT NULL,
		metadata   TEXT NOT NULL DEFAULT '{}',
		sealed     BLOB NOT NULL,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		UNIQUE (team, name)
	);
	INSERT INTO secrets_new (id, name, version, metadata, sealed, created_at, updated_at)
		SELECT id, name, version, metadata, sealed, created_at, updated_at FROM secrets;
	DROP TABLE secrets;
	ALTER TABLE secrets_new RENAME TO secrets;
	CREATE INDEX secrets_created ON secrets (created_at DESC, id DESC);
	CREATE TABLE snapshots_new (
		id         TEXT PRIMARY KEY,
		team       TEXT NOT NULL DEFAULT '` + tenancy.DefaultTeamID + `',
		name       TEXT,
		tag        TEXT NOT NULL,
		layer      TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		template   TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		spec       TEXT NOT NULL DEFAULT '{}',
		UNIQUE (team, name)
	);
	INSERT INTO snapshots_new (id, name, tag, layer, sandbox_id, template, created_at, spec)
		SELECT id, name, tag, layer, sandbox_id, template, created_at, spec FROM snapshots;
	DROP TABLE snapshots;
	ALTER TABLE snapshots_new RENAME TO snapshots;
	CREATE INDEX snapshots_created ON snapshots (created_at DESC, id DESC);`

// scope returns the SQL condition confining a query of table's records
// to the team ctx acts for, and its arguments: none when ctx acts for no
// principal (the daemon's own work sees every team's records). Another
// team's record is then exactly a missing one.
func scope(ctx context.Context, table string) (string, []any) {
	team := tenancy.Scope(ctx)
	if team == "" {
		return "1=1", nil
	}
	return table + ".team = ?", []any{team}
}

// ownerOf returns the team a new record of ctx belongs to: team if set
// (the daemon naming the team it works for), else ctx's.
func ownerOf(ctx context.Context, team string) string {
	if team != "" {
		return team
	}
	return tenancy.TeamOf(ctx)
}
