# nbgrader configuration of the small course with a speed test (tests/test_autograder_speed.py).
c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.CourseDirectory.course_id = "autograder-speed-fixture"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
