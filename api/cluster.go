package api

// Headers of `fence router`'s cluster-wide answers (/audit, /audit/stream,
// /audit/verify, /usage), which it gathers from every live node.
const (
	// HeaderUnansweredNodes names the live nodes (comma-separated) that did
	// not answer: their part is missing from the answer.
	HeaderUnansweredNodes = "X-Fence-Unanswered-Nodes"
	// HeaderAuditCursor is the position after the last record of a page of
	// GET /audit through the router, "node:seq,…" (the seq of the last
	// record read of each node): the next page's ?after=.
	HeaderAuditCursor = "X-Fence-Audit-Cursor"
)
