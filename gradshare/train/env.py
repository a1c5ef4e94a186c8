"""The environment variables the train driver sets for its workers (one home for their names)."""
DRIVER_PID_ENV = "GRADSHARE_DRIVER_PID"  # the train step that launched the workers
LAUNCHED_AT_ENV = "GRADSHARE_LAUNCHED_AT"  # its clock (time.time()) when it started the launcher
REHEARSAL_TAG = "gradshare.rehearsal"  # on train and commit runs of a study rehearsed on one GPU
