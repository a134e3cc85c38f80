package manager

// oomKills reads the sandbox's out-of-memory kill counter alone where its
// runtime can (native), else through the full Stats (gvisor).
func (n *ownInst) oomKills() (int64, error) {
	if c, ok := n.sb.(interface{ OOMKills() (int64, error) }); ok {
		return c.OOMKills()
	}
	st, err := n.sb.Stats()
	return st.OOMKills, err
}

// setBackground sets the CPU weight of a sandbox whose runtime has one
// (native); others are left as they are.
func (n *ownInst) setBackground(on bool) error {
	if c, ok := n.sb.(interface{ SetBackground(bool) error }); ok {
		return c.SetBackground(on)
	}
	return nil
}
