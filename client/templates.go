package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// TemplateStep is one step of a template build (E2B's build step).
type TemplateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
}

// TemplateBuildSpec is the body of a build trigger.
type TemplateBuildSpec struct {
	FromImage    string         `json:"fromImage,omitempty"`
	FromTemplate string         `json:"fromTemplate,omitempty"`
	Steps        []TemplateStep `json:"steps"`
	StartCmd     string         `json:"startCmd,omitempty"`
	ReadyCmd     string         `json:"readyCmd,omitempty"`
	Force        bool           `json:"force"`
}

// TemplateRegistration is the answer to RegisterTemplate.
type TemplateRegistration struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

// TemplateLogEntry is one line of a build's log.
type TemplateLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// TemplateBuildStatus is a build's state and a page of its log.
type TemplateBuildStatus struct {
	Status     string             `json:"status"`
	LogEntries []TemplateLogEntry `json:"logEntries"`
	Reason     *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// TemplateInfo is one template of ListTemplates.
type TemplateInfo struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	Aliases     []string  `json:"aliases"`
	Names       []string  `json:"names"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	BuildCount  int       `json:"buildCount"`
	BuildStatus string    `json:"buildStatus"`
}

// TemplateTag is one tag of a template.
type TemplateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// RegisterTemplate starts a build of the template called name
// (POST /v3/templates).
func (c *Client) RegisterTemplate(ctx context.Context, name string, tags []string) (*TemplateRegistration, error) {
	var out TemplateRegistration
	body := map[string]any{"name": name}
	if len(tags) > 0 {
		body["tags"] = tags
	}
	if _, err := c.do(ctx, http.MethodPost, "/v3/templates", nil, body, &out, http.StatusAccepted); err != nil {
		return nil, err
	}
	return &out, nil
}

// UploadTemplateFiles uploads a COPY archive (a tar, gzipped or not) of
// the given files hash unless the server has it already or force.
func (c *Client) UploadTemplateFiles(ctx context.Context, templateID, hash string, tar io.Reader, size int64, force bool) (uploaded bool, err error) {
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/templates/"+url.PathEscape(templateID)+"/files/"+hash, nil, nil, &link, http.StatusCreated); err != nil {
		return false, err
	}
	if link.Present && !force || link.URL == "" {
		return false, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, link.URL, tar)
	if err != nil {
		return false, err
	}
	req.ContentLength = size
	resp, err := c.http.Do(req)
	if err != nil {
		return false, fmt.Errorf("uploading files: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return false, decodeError(resp)
	}
	return true, nil
}

// TriggerTemplateBuild starts a registered build.
func (c *Client) TriggerTemplateBuild(ctx context.Context, templateID, buildID string, spec TemplateBuildSpec) error {
	_, err := c.do(ctx, http.MethodPost, "/v2/templates/"+url.PathEscape(templateID)+"/builds/"+buildID, nil, spec, nil, http.StatusAccepted)
	return err
}

// TemplateBuildStatus returns a build's state and its log from offset.
func (c *Client) TemplateBuildStatus(ctx context.Context, templateID, buildID string, offset int) (*TemplateBuildStatus, error) {
	var out TemplateBuildStatus
	q := url.Values{"logsOffset": {strconv.Itoa(offset)}}
	if _, err := c.do(ctx, http.MethodGet, "/templates/"+url.PathEscape(templateID)+"/builds/"+buildID+"/status", q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTemplates lists the built templates.
func (c *Client) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	var out []TemplateInfo
	if _, err := c.do(ctx, http.MethodGet, "/templates", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteTemplate deletes a template by ID or name.
func (c *Client) DeleteTemplate(ctx context.Context, idOrName string) error {
	_, err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(idOrName), nil, nil, nil, http.StatusNoContent)
	return err
}

// TemplateTags lists a template's tags.
func (c *Client) TemplateTags(ctx context.Context, idOrName string) ([]TemplateTag, error) {
	var out []TemplateTag
	if _, err := c.do(ctx, http.MethodGet, "/templates/"+url.PathEscape(idOrName)+"/tags", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out, nil
}

// AssignTemplateTags points tags at the build target (name[:tag]) names.
func (c *Client) AssignTemplateTags(ctx context.Context, target string, tags []string) error {
	_, err := c.do(ctx, http.MethodPost, "/templates/tags", nil, map[string]any{"target": target, "tags": tags}, nil, http.StatusCreated)
	return err
}

// RemoveTemplateTags removes tags of a template.
func (c *Client) RemoveTemplateTags(ctx context.Context, name string, tags []string) error {
	_, err := c.do(ctx, http.MethodDelete, "/templates/tags", nil, map[string]any{"name": name, "tags": tags}, nil, http.StatusNoContent)
	return err
}
