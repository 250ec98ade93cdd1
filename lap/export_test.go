package lap

// SetApprovalWaitHook makes f run whenever a call of s is about to wait for
// an approval (/message after its proposal, /confirm-result).
func SetApprovalWaitHook(s *Server, f func()) { s.testApprovalWait.Store(&f) }

// HeldTabs is how many tids have a close signal (a paired tab, or a call holding one).
func HeldTabs(s *Server) int { return s.tabGone.len() }
