package api

// Principal is the body of fence's GET /principal: who the credential of
// the request is (never the credential). fence router asks it of a node
// to sign a dashboard session in.
type Principal struct {
	Team  string `json:"team"`
	KeyID string `json:"keyID"`
	Admin bool   `json:"admin"`
}
