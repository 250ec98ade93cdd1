package pairing

import "sort"

// TabInfo is what the registry knows about one tid it holds: a live tab, or
// one that closed within Retention.
type TabInfo struct {
	TID           string `json:"tid"`
	AppName       string `json:"appName,omitempty"` // from the hello; "" before it
	AppVersion    string `json:"appVersion,omitempty"`
	Connected     bool   `json:"connected"`
	Visible       *bool  `json:"visible,omitempty"` // nil = the tab never said
	LastHeartbeat int64  `json:"lastHeartbeatAt,omitempty"`
	ConnectedAt   int64  `json:"connectedAt,omitempty"` // ms
	Reconnects    int    `json:"reconnects"`
	Calls         int64  `json:"calls"` // RPCs sent to the tid since the registry first saw it
}

// Tabs returns up to max of the tids the registry holds (max ≤ 0 = all),
// connected ones first, then by tid, and how many it holds in all. For an
// admin view; it takes each session's lock briefly.
func (r *Registry) Tabs(max int) ([]TabInfo, int) {
	r.mu.Lock()
	ss := make([]*session, 0, len(r.sessions))
	for _, s := range r.sessions {
		ss = append(ss, s)
	}
	r.mu.Unlock()
	out := make([]TabInfo, 0, len(ss))
	for _, s := range ss {
		s.mu.Lock()
		if s.dropped {
			s.mu.Unlock()
			continue
		}
		t := TabInfo{TID: s.tid, Connected: s.cur != nil, LastHeartbeat: s.lastHB, ConnectedAt: s.connectedAt, Calls: s.rpcs.Load()}
		if s.hello != nil {
			t.AppName, t.AppVersion = s.hello.AppName, s.hello.AppVersion
		}
		if s.visible != nil {
			v := *s.visible
			t.Visible = &v
		}
		if s.accepts > 1 {
			t.Reconnects = s.accepts - 1
		}
		s.mu.Unlock()
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Connected != out[j].Connected {
			return out[i].Connected
		}
		return out[i].TID < out[j].TID
	})
	total := len(out)
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, total
}
