# nbgrader configuration of the small course used by the autograder's tests: the
# instructor's notebooks are in solutions/ and the released ones in exercises/,
# as in the real course.
c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.CourseDirectory.course_id = "autograder-fixture"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
