/* params.h - moved to core/params.h. A forwarding header for branches begun before
 * the move; removed once they have landed. */
#include "core/params.h"
