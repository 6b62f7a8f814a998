/* gdal_msgs.c - see gdal_msgs.h */
#include "io/gdal_msgs.h"

#include <cpl_error.h>
#include <stdio.h>

#include "io/url.h"

static void CPL_STDCALL capture_handler(CPLErr cls, CPLErrorNum num, const char *msg)
{
    (void)num;
    tw_gdal_msgs *m = CPLGetErrorHandlerUserData();
    if (!m) return;
    if (!msg) msg = "";
    /* GDAL names URLs in its messages (a presigned one with its signature):
     * only a redacted copy is kept (url.h). */
    if (cls == CE_Failure || cls == CE_Fatal) {
        if (m->failures++ == 0) tw_url_redact(msg, m->failure, sizeof m->failure);
    } else if (cls == CE_Warning) {
        if (!m->first_warning[0]) tw_url_redact(msg, m->first_warning, sizeof m->first_warning);
        tw_url_redact(msg, m->last_warning, sizeof m->last_warning);
    }
}

void tw_gdal_capture_begin(tw_gdal_msgs *m)
{
    m->failures = 0;
    m->failure[0] = m->first_warning[0] = m->last_warning[0] = '\0';
    CPLPushErrorHandlerEx(capture_handler, m);
}

void tw_gdal_capture_end(void)
{
    CPLPopErrorHandler();
}

const char *tw_gdal_capture_text(const tw_gdal_msgs *m, const char *fallback)
{
    if (m->failure[0]) return m->failure;
    if (m->last_warning[0]) return m->last_warning;
    return fallback;
}
