package process

import (
	"bytes"
	"encoding/binary"
	"net/http"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
)

// WarmCodecs makes protobuf set up, ahead of the first request, what the
// first Start otherwise sets up itself (the messages' type information,
// their JSON and binary codecs): a sandbox's first command waits for its
// agent's start, and the agent runs this beside its other setup. It
// changes no state of the Service; running it is optional.
func WarmCodecs() {
	stdin := false
	req := &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true", Args: []string{""}, Envs: map[string]string{"": ""}}, Stdin: &stdin,
		Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 1, Rows: 1}}}
	events := []*pb.ProcessEvent{
		{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: 1}}},
		{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: []byte{0}}}}},
		{Event: &pb.ProcessEvent_End{End: endEvent(0)}},
		{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}},
	}
	msgs := []proto.Message{req}
	for _, ev := range events {
		msgs = append(msgs, &pb.StartResponse{Event: ev}, &pb.ConnectResponse{Event: ev})
	}
	for _, m := range msgs {
		if b, err := protojson.Marshal(m); err == nil {
			_ = protojson.Unmarshal(b, m.ProtoReflect().New().Interface())
		}
		if b, err := proto.Marshal(m); err == nil {
			_ = proto.Unmarshal(b, m.ProtoReflect().New().Interface())
		}
	}
}

// WarmStream makes Connect set up, ahead of the first request, what the
// first stream's end otherwise sets up itself: encoding/json's encoder of
// the end-of-stream message that closes every Start (built by reflection
// on first use, about 0.1 ms of a sandbox's first command) and the
// interface tables of a streaming handler. h is a Service's handler
// (Service.Handler): it is served, in memory, one Connect request that
// names no process, which the Service refuses (InvalidArgument) before it
// looks at any process. It opens nothing, starts nothing and changes no
// state of the Service; what it writes is dropped. Running it is optional.
func WarmStream(h http.Handler) {
	msg := []byte(`{}`)
	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	req, err := http.NewRequest(http.MethodPost, "http://agent"+processconnect.ProcessConnectProcedure, bytes.NewReader(append(body, msg...)))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/connect+json")
	h.ServeHTTP(discardResponse{http.Header{}}, req)
}

// discardResponse is an http.ResponseWriter (and Flusher) that keeps
// nothing written to it.
type discardResponse struct{ h http.Header }

func (d discardResponse) Header() http.Header       { return d.h }
func (discardResponse) Write(b []byte) (int, error) { return len(b), nil }
func (discardResponse) WriteHeader(int)             {}
func (discardResponse) Flush()                      {}
