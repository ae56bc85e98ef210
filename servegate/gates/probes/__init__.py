"""HTTP probes: the served model as a client sees it (servegate's app in process, or the remote directly), and
the contract gate's checks that hold on every answer, alone and under load."""
