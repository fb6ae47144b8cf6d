"""``plait explain``: a finished run beside the planner's prediction of it (``run``), and two runs side by
side (``compare``). It reads what ``plait.observe`` wrote and asks ``plait.plan``, so it sits above both."""
