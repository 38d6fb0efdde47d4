package state

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// detached is a micro.Request answered from another goroutine than the
// handler micro called: it publishes the answer on the request's reply
// subject itself.
type detached struct {
	nc             *nats.Conn
	subject, reply string
	data           []byte
	headers        micro.Headers
}

var _ micro.Request = (*detached)(nil)

func (d *detached) send(m *nats.Msg, opts []micro.RespondOpt) error {
	for _, o := range opts {
		o(m)
	}
	m.Subject = d.reply
	return d.nc.PublishMsg(m)
}

func (d *detached) Respond(data []byte, opts ...micro.RespondOpt) error {
	return d.send(&nats.Msg{Data: data}, opts)
}

func (d *detached) RespondJSON(v any, opts ...micro.RespondOpt) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: %w", micro.ErrMarshalResponse, err)
	}
	return d.Respond(data, opts...)
}

func (d *detached) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	return d.send(&nats.Msg{Data: data, Header: nats.Header{micro.ErrorHeader: {description}, micro.ErrorCodeHeader: {code}}}, opts)
}

func (d *detached) Data() []byte           { return d.data }
func (d *detached) Headers() micro.Headers { return d.headers }
func (d *detached) Subject() string        { return d.subject }
func (d *detached) Reply() string          { return d.reply }
