package process

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/fencesandbox/fence/api/envd/process"
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
