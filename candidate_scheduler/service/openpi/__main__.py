import sys

from candidate_scheduler.service.openpi.launch import main

sys.exit(main())
