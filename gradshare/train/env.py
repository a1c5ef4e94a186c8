"""The environment variables of an arm's processes (one home for their names): the ones the
train driver sets for its workers, and the ones a caller of train (the emulated-hosts step)
sets for the driver."""
DRIVER_PID_ENV = "GRADSHARE_DRIVER_PID"  # the train step that launched the workers
LAUNCHED_AT_ENV = "GRADSHARE_LAUNCHED_AT"  # its clock (time.time()) when it started the launcher
LINK_ENV = "GRADSHARE_LINK"  # what the arm's run logs as its `link` parameter
RATE_ENV = "GRADSHARE_LINK_RATE_MBIT"  # ... and as `link_rate_mbit` (the projection reads it)
