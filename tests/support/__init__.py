"""What several test modules share: fresh processes from a fork server (``fresh_processes``)
and fake xpu/cuda devices that generate Inductor's real wrapper source on the CPU
(``fake_devices``)."""
