"""What several test modules share: fresh processes from a fork server (``fresh_processes``),
fake xpu/cuda devices that generate Inductor's real wrapper source on the CPU
(``fake_devices``), and what the scripted device modules of the backend tests have in common
(``scripted_devices``)."""
