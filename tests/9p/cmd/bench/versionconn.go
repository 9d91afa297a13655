package main

import (
	"encoding/binary"
	"net"
)

// rewriteConn adjusts the client's first two messages for diod's sake, and
// does the same for every server so that all see identical traffic:
//   - Tversion "9P2000.L.Google.N" becomes plain "9P2000.L" (diod refuses
//     the extended string; the client has no option to ask for the plain one);
//   - Tattach with no user (uname "", n_uname NOUID) becomes uname "root",
//     n_uname 0 (diod cannot attach without a user).
type rewriteConn struct {
	net.Conn
	pending []byte
	done    bool
}

const (
	tversion = 100
	tattach  = 104
)

func (c *rewriteConn) Write(p []byte) (int, error) {
	if c.done {
		return c.Conn.Write(p)
	}
	c.pending = append(c.pending, p...)
	for len(c.pending) >= 7 && len(c.pending) >= int(binary.LittleEndian.Uint32(c.pending)) {
		n := int(binary.LittleEndian.Uint32(c.pending))
		frame := c.pending[:n]
		switch frame[4] {
		case tversion:
			frame = build(frame[4:7], frame[7:11], str("9P2000.L"))
		case tattach:
			// fid[4] afid[4] uname[s] aname[s] n_uname[4]
			body := frame[7:]
			ids := body[:8]
			ulen := int(binary.LittleEndian.Uint16(body[8:]))
			rest := body[10+ulen:]
			alen := int(binary.LittleEndian.Uint16(rest))
			aname := rest[:2+alen]
			frame = build(frame[4:7], ids, str("root"), aname, []byte{0, 0, 0, 0})
			c.done = true
		}
		if _, err := c.Conn.Write(frame); err != nil {
			return 0, err
		}
		c.pending = c.pending[n:]
	}
	if c.done && len(c.pending) > 0 {
		if _, err := c.Conn.Write(c.pending); err != nil {
			return 0, err
		}
		c.pending = nil
	}
	return len(p), nil
}

func str(s string) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...)
}

func build(parts ...[]byte) []byte {
	n := 4
	for _, p := range parts {
		n += len(p)
	}
	out := binary.LittleEndian.AppendUint32(make([]byte, 0, n), uint32(n))
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
