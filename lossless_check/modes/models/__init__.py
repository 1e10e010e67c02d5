"""A user's own target/assistant pair: loading checkpoints offline, drafting with them, and the exact,
statistical and greedy checks of one pair (:mod:`.pair`)."""
