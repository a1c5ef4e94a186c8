"""The kinds of arm (`gradshare.kinds.table`): each one file that owns its plan options, hook,
saved state, bytes, cost part and words (`gradshare.kinds.base.ArmKind`)."""
